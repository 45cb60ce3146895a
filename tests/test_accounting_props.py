"""Property-based tests of the accounting patch's invariants (hypothesis).

They drive vLLM's real ``PrefillStats`` / ``PromptTokenStats`` (with the patch
applied in this process) and the patch's scheduler hooks on stand-in
scheduler parts, over arbitrary connector reports, preemptions, truncations
and finalizations. The invariant, at every point::

    0 <= local, 0 <= external, local + external + computed == prompt
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

vllm_stats = pytest.importorskip("vllm.v1.metrics.stats")

from load_tests.observe.counters import SOURCES  # noqa: E402
from patches import accounting  # noqa: E402

accounting.PATCH.apply()
PrefillStats, PromptTokenStats = vllm_stats.PrefillStats, vllm_stats.PromptTokenStats

anything = st.one_of(
    st.integers(-(10**12), 10**12), st.floats(allow_nan=True), st.none(), st.text(max_size=3), st.booleans()
)


def test_load_tests_sources_are_vllms():
    """The load tests' one list of prompt-token sources is the one vLLM labels its counter with."""
    assert SOURCES == PromptTokenStats.ALL_SOURCES


def assert_consistent(s) -> None:
    assert s.num_prompt_tokens >= 0 and s.num_local_cached_tokens >= 0 and s.num_external_cached_tokens >= 0
    assert s.num_computed_tokens >= 0 and s.num_cache_creation_tokens >= 0
    assert s.num_local_cached_tokens + s.num_external_cached_tokens + s.num_computed_tokens == s.num_prompt_tokens
    assert s.num_cached_tokens == s.num_local_cached_tokens + s.num_external_cached_tokens


@given(st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6), st.integers(-(10**6), 10**6))
def test_set_never_asserts_and_stays_consistent(prompt, local, external):
    s = PrefillStats()
    s.set(prompt, local, external)
    assert_consistent(s)
    if local >= 0 and external >= 0 and local + external <= prompt:
        assert (s.num_prompt_tokens, s.num_local_cached_tokens, s.num_external_cached_tokens) == (
            prompt,
            local,
            external,
        )


@given(st.integers(0, 10**5), st.integers(0, 10**5), st.integers(0, 10**5), st.integers(-(10**6), 10**6))
def test_finalize_never_asserts(prompt, local, external, cached):
    s = PrefillStats()
    s.set(prompt, local, external)
    s.finalize(cached)
    assert_consistent(s)


def _request(num_tokens):
    return SimpleNamespace(
        request_id="r",
        num_tokens=num_tokens,
        num_prompt_tokens=num_tokens,
        prefill_stats=PrefillStats(),
        num_computed_tokens=0,
    )


@given(st.integers(1, 5000), st.integers(0, 5000), anything, st.booleans())
def test_connector_reports_are_possible_or_zero(num_tokens, local, reported, load_async):
    local = min(local, num_tokens - 1)
    n, a = accounting.checked_connector_report(_request(num_tokens), local, reported, load_async)
    if reported is None:
        assert n is None
        return
    assert isinstance(n, int) and 0 <= n <= num_tokens - local
    assert n == 0 or n == reported
    assert a is False or n > 0


class FakeConnector:
    def __init__(self, reports):
        self.reports = reports

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.reports.pop(0), True


class FakeKVCacheManager:
    def allocate_slots(self, request, num_new_tokens, **kwargs):
        return object()


# A request's life: admitted with a (possibly lying) connector report; maybe
# preempted and re-admitted with new hits; maybe truncated after a load
# failure; finalized; then counted by the frontend.
life = st.fixed_dictionaries(
    {
        "num_tokens": st.integers(1, 4000),
        "local": st.integers(0, 4000),
        "report": anything,
        "readmissions": st.lists(st.tuples(st.integers(0, 4000), anything), max_size=3),
        "truncate_to": st.one_of(st.none(), st.integers(0, 4000)),
        "cached_at_finalize": st.integers(-100, 5000),
    }
)


@settings(max_examples=300)
@given(st.lists(life, min_size=1, max_size=20))
def test_request_lives_keep_every_counter_consistent(lives):
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    guarded = accounting.guarded_counter_cls(Counter)
    totals = {src: guarded(f"t_{src}", "test", registry=registry) for src in PromptTokenStats.ALL_SOURCES}
    total_prompt = guarded("t_prompt", "test", registry=registry)
    frontend = PromptTokenStats()

    for spec in lives:
        request = _request(spec["num_tokens"])
        scheduler = SimpleNamespace(
            connector=FakeConnector([spec["report"]] + [r for _, r in spec["readmissions"]]),
            kv_cache_manager=FakeKVCacheManager(),
        )
        accounting._instrument_scheduler(scheduler)

        def admit(local, first, request=request, scheduler=scheduler):
            local = min(local, request.num_tokens - 1)
            ext, _ = scheduler.connector.get_num_new_matched_tokens(request, local)
            ext = ext or 0
            if first:
                request.prefill_stats.set(request.num_prompt_tokens, local, ext)
            scheduler.kv_cache_manager.allocate_slots(
                request, 1, num_new_computed_tokens=local, num_external_computed_tokens=ext
            )
            request.num_computed_tokens = local + ext
            assert_consistent(request.prefill_stats)

        admit(spec["local"], first=True)
        for local, _ in spec["readmissions"]:
            request._fuzzserve_restat = True  # what the _preempt_request hook sets
            admit(local, first=False)
        if spec["truncate_to"] is not None:

            def original(self, requests, invalid, scheduled, spec=spec):
                for r in requests:
                    r.num_computed_tokens = min(r.num_computed_tokens, spec["truncate_to"])
                return {r.request_id for r in requests}, 0, set()

            accounting._wrap_invalid_blocks(original)(None, iter([request]), {1}, {})
            assert_consistent(request.prefill_stats)
        request.prefill_stats.finalize(spec["cached_at_finalize"])
        assert_consistent(request.prefill_stats)

        frontend.update_from_output(request.prefill_stats)
        for src in PromptTokenStats.ALL_SOURCES:
            totals[src].inc(frontend.get_by_source(src))
        total_prompt.inc(frontend.total)
        frontend = PromptTokenStats()

    def value(c) -> float:
        sample = registry.get_sample_value(c._name + "_total")
        assert sample is not None, c._name
        return sample

    assert sum(value(c) for c in totals.values()) == value(total_prompt)
    assert all(value(c) >= 0 for c in totals.values())


@given(st.one_of(st.integers(-(10**9), -1), st.floats(allow_nan=True, allow_infinity=True)))
def test_guarded_counter_drops_bad_increments(amount):
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    c = accounting.guarded_counter_cls(Counter)("g", "test", ["k"], registry=registry)
    c.labels(k="a").inc(5)
    c.labels(k="a").inc(amount)  # would raise ValueError (or poison the series) without the guard
    v = registry.get_sample_value("g_total", {"k": "a"})
    assert v == 5 or (math.isfinite(amount) and amount >= 0)


def test_frontend_sanitizes_an_inconsistent_prefill_stats():
    bad = PrefillStats()
    bad.num_prompt_tokens, bad.num_local_cached_tokens, bad.num_external_cached_tokens = 100, 80, -30
    bad.num_computed_tokens, bad.num_cached_tokens = 50, 50
    pts = PromptTokenStats()
    pts.update_from_output(bad)
    assert pts.external_kv_transfer == 0 and pts.local_cache_hit == 80 and pts.computed == 20 and pts.total == 100
