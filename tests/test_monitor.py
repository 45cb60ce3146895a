"""The invariant monitor catches each violation class on synthetic metric histories.

Each test builds a history of scrapes (``ReplicaCounters`` per replica) and
checks that the checker flags exactly the bad case, and stays quiet on the
good twin of it (a checker that cannot fail proves nothing).
"""

from __future__ import annotations

import pytest

from load_tests.client import RequestResult
from load_tests.monitor import InvariantChecker, Snapshot
from load_tests.replica_metrics import ReplicaCounters
from load_tests.summary import Fault, Slo, server_cross_check, summarize


def rc(replica="r1", prompt=100.0, local=60.0, hit=30.0, ext=10.0, cached=40.0, finished=None, violations=None,
       running=0.0):
    return ReplicaCounters(replica=replica, node="n", prompt_tokens=prompt, prompt_tokens_cached=cached,
                           running=running, by_source={"local_compute": local, "local_cache_hit": hit,
                                                        "external_kv_transfer": ext},
                           requests_finished=finished or {"length": 4.0}, violations=violations or {})


def run(history, dead=frozenset(), quiescent=None, expected=()):
    checker = InvariantChecker(expected)
    for t, snap in enumerate(history):
        checker.observe(Snapshot(float(t), snap, dead))
    if quiescent is not None:
        checker.check_quiescent(Snapshot(float(len(history)), quiescent, dead))
    return checker


def kinds(checker):
    return sorted({v.kind for v in checker.violations})


def test_a_healthy_history_passes():
    h = [{"r1": rc(prompt=0, local=0, hit=0, ext=0, cached=0)}, {"r1": rc()}, {"r1": rc(prompt=200, local=160)}]
    c = run(h, quiescent={"r1": rc(prompt=200, local=160)})
    assert c.ok, c.violations


def test_negative_counter():
    c = run([{"r1": rc(ext=-5.0, local=75.0)}])
    assert kinds(c) == ["negative"]
    v = c.violations[0]
    assert v.replica == "r1" and "external_kv_transfer" in v.counter and v.t == 0.0
    assert v.context["counters"]["by_source{external_kv_transfer}"] == -5.0, "full context kept"


def test_decrease_within_one_replica():
    c = run([{"r1": rc()}, {"r1": rc(prompt=90, local=50)}])
    assert kinds(c) == ["decrease"]
    assert {v.counter for v in c.violations} == {"prompt_tokens", "by_source{local_compute}"}
    assert c.violations[0].context["previous"]["prompt_tokens"] == 100


def test_a_counter_that_vanishes_is_a_decrease():
    c = run([{"r1": rc(violations={"connector_negative": 0.0}, finished={"length": 4, "stop": 2})},
             {"r1": rc(finished={"length": 4})}])
    assert kinds(c) == ["decrease"] and "requests_finished{stop}" in c.violations[0].counter


def test_a_restarted_replica_is_a_new_series_not_a_reset():
    """The replacement replica starts from zero under a new ReplicaId: no violation."""
    h = [{"r1": rc(prompt=500, local=460)},
         {"r1": rc(prompt=500, local=460), "r2": rc("r2", prompt=10, local=10, hit=0, ext=0, cached=0)}]
    assert run(h).ok
    # ... while the same id going back to zero is exactly what must be caught
    reset = run([{"r1": rc(prompt=500, local=460)}, {"r1": rc(prompt=10, local=10, hit=0, ext=0, cached=0)}])
    assert "decrease" in kinds(reset)


def test_stale_series_of_a_dead_replica_is_recognised():
    """r1 died mid-flight: its frozen counters break the identity but it is left out of quiescence checks."""
    mid_flight = rc(prompt=120, local=60)  # parts sum to 100, not 120
    c = run([{"r1": mid_flight, "r2": rc("r2")}], dead=frozenset({"r1"}),
            quiescent={"r1": mid_flight, "r2": rc("r2")})
    assert c.ok and c.stale == {"r1"}
    # the same numbers on a live replica are a violation
    live = run([{"r1": mid_flight}], quiescent={"r1": mid_flight})
    assert kinds(live) == ["sum_mismatch"]


def test_sum_mismatch_and_cached_exceeding_total_at_quiescence():
    c = run([{"r1": rc()}], quiescent={"r1": rc(prompt=100, local=61, cached=101)})
    assert kinds(c) == ["cached_exceeds_total", "sum_mismatch"]
    msg = [v.message for v in c.violations if v.kind == "sum_mismatch"][0]
    assert "101" in msg and "100" in msg


def test_not_quiescent_is_reported():
    c = run([], quiescent={"r1": rc(running=3)})
    assert kinds(c) == ["not_quiescent"]


def test_accounting_violations_unexpected_vs_explained_by_faults():
    h = [{"r1": rc()}, {"r1": rc(violations={"connector_negative": 3.0})}]
    assert kinds(run(h)) == ["accounting_violation"]
    c = run(h, expected=("connector_negative",))
    assert c.ok and c.expected_violations == {"connector_negative": 3.0}
    # a violation already present at the first scrape counts too
    assert kinds(run([{"r1": rc(violations={"prefill_finalize_negative": 1.0})}])) == ["accounting_violation"]


def result(i, outcome, start=0.0, e2e=1.0, **kw):
    return RequestResult(index=i, outcome=outcome, start=start, e2e=e2e, ttft=0.1, chunks=5, completion_tokens=5,
                         spec={"expect": "4xx" if outcome == "rejected" else "ok", "stream": True, **kw.pop("spec", {})},
                         **kw)


def test_cross_check_client_against_engine_counters():
    res = [result(0, "ok"), result(1, "ok"), result(2, "cancelled"), result(3, "rejected")]
    good = {"r1": rc(finished={"length": 2.0, "abort": 1.0})}
    assert server_cross_check(res, good, False)["problems"] == []
    lost = {"r1": rc(finished={"length": 1.0})}
    assert "clients received 2" in server_cross_check(res, lost, False)["problems"][0]
    extra = {"r1": rc(finished={"length": 4.0})}
    assert server_cross_check(res, extra, False)["problems"], "more completions than requests"
    phantom = {"r1": rc(finished={"length": 2.0, "abort": 5.0})}
    assert "got past the router" in server_cross_check(res, phantom, False)["problems"][0]


def summary_of(results, started=None, checker=None, faults=()):
    """Summarize with engine counters that agree with the clients (unless a checker is given)."""
    if checker is None:
        n_ok = sum(r.outcome == "ok" for r in results)
        checker = run([{}, {"r1": rc(finished={"length": float(n_ok)})}])  # baseline scrape, then the end
    return summarize(results, len(results) if started is None else started, checker, list(faults), 10.0, Slo(),
                     [], [])


def test_verdict_fails_on_lost_and_unexpected_requests():
    ok = [result(i, "ok") for i in range(3)]
    assert summary_of(ok)["passed"]
    assert not summary_of(ok, started=4)["passed"], "a request started but never finished is lost"
    truncated = summary_of(ok + [result(3, "truncated")])
    assert not truncated["passed"] and "lost" in truncated["failures"][0]
    err = summary_of(ok + [result(3, "server_error", start=5.0)])
    assert not err["passed"] and err["errors_by_kind"] == {"server_error": 1}


def test_errors_around_a_replica_kill_are_explained():
    fault = Fault("replica_kill", 5.0)
    res = [result(0, "ok"), result(1, "stream_error", start=4.0, e2e=2.0), result(2, "server_error", start=60.0)]
    s = summary_of(res, faults=[fault])
    assert s["errors_explained_by_faults"] == {"stream_error": 1}
    assert s["errors_by_kind"] == {"server_error": 1} and not s["passed"], "an error long after the kill is not"


def test_bad_request_must_name_its_field():
    good = result(0, "rejected", status=400, error="vllm_xargs.fuzz_strength must be >= 0",
                  error_param="vllm_xargs.fuzz_strength",
                  spec={"expect_status": 400, "expect_param": "vllm_xargs.fuzz_strength"})
    vague = result(1, "rejected", status=400, error="bad request",
                   spec={"expect_status": 400, "expect_param": "vllm_xargs.fuzz_mode"})
    ok = result(2, "ok")
    assert summary_of([good, ok])["passed"]
    s = summary_of([good, vague, ok])
    assert not s["passed"] and s["bad_requests"]["problems"][0]["want_param"] == "vllm_xargs.fuzz_mode"


def test_verdict_fails_on_invariant_violation():
    checker = run([{}, {"r1": rc(finished={"length": 1.0})}, {"r1": rc(prompt=50, local=10, finished={"length": 1.0})}])
    s = summary_of([result(0, "ok")], checker=checker)
    assert not s["passed"] and s["invariants"]["first_violation"]["kind"] == "decrease"


@pytest.mark.parametrize("outcome", ["unexpected_4xx", "unexpected_ok", "transport_error", "timeout"])
def test_every_failure_outcome_fails_the_run(outcome):
    assert not summary_of([result(0, "ok"), result(1, outcome, start=3.0)])["passed"]


def test_cross_check_counts_only_this_runs_traffic():
    """Against a long-lived deployment the engines' counts start from the scrape before the run."""
    res = [result(0, "ok"), result(1, "ok")]
    before = {"r1": rc(finished={"length": 100.0})}
    after = {"r1": rc(finished={"length": 102.0})}
    assert server_cross_check(res, after, False, before)["problems"] == []
    assert server_cross_check(res, after, False)["problems"], "without the baseline the old traffic shows"
    assert server_cross_check(res, {"r1": rc(finished={"length": 101.0})}, False, before)["problems"]
