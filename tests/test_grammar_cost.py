"""benchmarks/investigations/grammar_cost.py: its specs are what the guard would admit, and its measurement can see a
compile that runs past its limit (and one that does not)."""

from __future__ import annotations

import pytest

from benchmarks.investigations.grammar_cost import _optional_properties, largest_under, measure, spec_bytes, specs
from serve_app.ingress.xargs_policy import DEFAULT_LIMITS, RequestLimits, RequestRejected, check_limits


def test_every_spec_is_within_the_cap_and_the_largest_are_maximal():
    cap = DEFAULT_LIMITS.max_grammar_bytes
    on = RequestLimits(structured_outputs=True)
    for name, spec in specs().items():
        assert spec_bytes(spec) <= cap, name
        check_limits({"structured_outputs": spec}, on)  # admitted by the guard with structured outputs on
        with pytest.raises(RequestRejected, match="structured outputs are off"):
            check_limits({"structured_outputs": spec})  # and refused as shipped
    largest = largest_under(cap, _optional_properties, 10)
    n = len(largest["json"]["properties"])
    assert spec_bytes(_optional_properties(n + 10)) > cap


def test_largest_under_refuses_a_cap_nothing_fits():
    with pytest.raises(ValueError, match="over 10 bytes"):
        largest_under(10, _optional_properties)


@pytest.mark.timeout(300)
def test_a_compile_is_timed_and_one_past_its_limit_is_killed():
    small = specs()["small JSON object (baseline)"]
    done = measure("239", small, timeout_s=120)
    assert done["started"] and not done["timed_out"] and done["compile_s"] > 0 and "error" not in done, done
    assert done["vocab_size"] == 239
    # tens of seconds of compile on 32k tokens (measured): killed at a 5 s limit, after the child had begun on
    # the spec (not while it was still starting up)
    slow = measure("32000", specs()["string pattern ([a-z]{0,50}){0,50}"], timeout_s=5)
    assert slow["started"] and slow["timed_out"] and "compile_s" not in slow, slow
    # the limit counts from the child's start on the spec; one that has not started within startup_s is killed
    stuck = measure("239", small, timeout_s=120, startup_s=0.01)
    assert not stuck["started"] and stuck["timed_out"] and "compile_s" not in stuck, stuck
