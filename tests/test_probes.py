"""The soak's greedy probes (load_tests/plan/probes.py): the set is fixed, and the comparison can fail."""

from __future__ import annotations

from typing import Any

from load_tests.judge.probes import answers, compare, reference_is_stable
from load_tests.load.client import RequestResult
from load_tests.plan.probes import PROBE_INDEX_BASE, probe_specs
from load_tests.plan.workload import RequestSpec
from load_tests.results.models import ProbeAnswer


def body(s: RequestSpec) -> dict[str, Any]:
    """A probe's JSON body (every probe has one)."""
    assert s.body is not None, s
    return s.body


def test_the_probe_set_is_fixed_greedy_and_tagged():
    a, b = probe_specs(0), probe_specs(0)
    assert [s.body for s in a] == [s.body for s in b], "the same probes every round"
    assert all(body(s)["temperature"] == 0 and not s.stream for s in a)
    assert any(len(body(s)["prompt"].split()) > 500 for s in a), "some on the shared prefixes (offload tier)"
    assert any("vllm_xargs" in body(s) for s in a), "some fuzzed (seeded gaussian)"
    assert [s.index for s in probe_specs(2)][:2] == [3 * PROBE_INDEX_BASE, 3 * PROBE_INDEX_BASE + 1]


def result(spec, outcome="ok", text="a b c", start=1.0):
    return RequestResult(spec.index, outcome, start=start, text=text if outcome == "ok" else None, spec=spec.to_json())


def test_answers_under_faults_must_equal_the_fault_free_ones():
    ref = answers([result(s) for s in probe_specs(0)])
    same = answers([result(s) for s in probe_specs(1)])
    verdict = compare(ref, same)
    assert verdict.problems == [] and verdict.compared == verdict.equal == len(ref)
    specs = probe_specs(1)
    one_off = answers([result(s, text="a b d" if i == 3 else "a b c", start=70.0) for i, s in enumerate(specs)])
    verdict = compare(ref, one_off)
    assert verdict.problems and verdict.differing[0]["index"] == 3 and "t = 70 s" in verdict.problems[0]
    failed = answers([result(s, outcome="server_error") for s in specs])
    assert "nothing compared" in compare(ref, failed).problems[0], "a run whose probes all failed proves nothing"


def test_a_reference_that_answers_differently_twice_is_refused():
    first = [ProbeAnswer(0, 0, 0.0, "a"), ProbeAnswer(0, 1, 0.0, "b")]
    assert reference_is_stable(first, [ProbeAnswer(1, 0, 0.0, "a"), ProbeAnswer(1, 1, 0.0, "b")]) == []
    assert reference_is_stable(first, [ProbeAnswer(1, 0, 0.0, "a"), ProbeAnswer(1, 1, 0.0, "c")])
