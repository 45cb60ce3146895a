"""The verdict's code, fed each bad case and its good twin: invariants, scrapes, deaths, planned faults.

Each test builds a history of scrapes (``ReplicaCounters`` per replica) and
feeds it through the same objects the CLI uses (``InvariantChecker``,
``check_planned_faults``, ``summarize``), asserting that the bad case fails
the run and names what broke, and that its good twin passes (a checker that
cannot fail proves nothing). ``tests/test_load_cli.py`` runs the same
failures end to end through the CLI against a broken target.
"""

from __future__ import annotations

from typing import Any

import pytest

from load_tests.judge.departures import unexpected_deaths
from load_tests.judge.evidence import check_planned_faults
from load_tests.judge.summary import server_cross_check, summarize
from load_tests.load.client import RequestResult
from load_tests.observe.counters import ReplicaCounters
from load_tests.observe.monitor import DEATH_BOUND, SCRAPE_FAILURE_BOUND, InvariantChecker, Snapshot
from load_tests.plan.slo import Slo
from load_tests.plan.steps import Redeploy
from load_tests.results.events import OperationFailed, Redeployed, ReplicaKilled


def rc(
    replica="r1",
    prompt=100.0,
    local=60.0,
    hit=30.0,
    ext=10.0,
    cached=40.0,
    finished=None,
    violations=None,
    running=0.0,
    alive=True,
    healthy=None,
    node="n",
    **fields,
):
    return ReplicaCounters(
        replica=replica,
        node=node,
        prompt_tokens=prompt,
        prompt_tokens_cached=cached,
        running=running,
        by_source={"local_compute": local, "local_cache_hit": hit, "external_kv_transfer": ext},
        requests_finished=finished or {"length": 4.0},
        violations=violations or {},
        gauges=alive,
        healthy=healthy,
        **fields,
    )


def snaps(history, dead=frozenset(), errors=None):
    return [Snapshot(float(t), s, dead, errors=(errors or {}).get(t, {})) for t, s in enumerate(history)]


def run(history, dead=frozenset(), quiescent=None, expected=(), errors=None):
    checker = InvariantChecker(expected)
    for snap in snaps(history, dead, errors):
        checker.observe(snap)
    if quiescent is not None:
        checker.check_quiescent(Snapshot(float(len(history)), quiescent, dead))
    return checker


def kinds(checker):
    return sorted({v.kind for v in checker.violations})


# ---------------------------------------------------------------- invariants


def test_a_healthy_history_passes():
    h = [{"r1": rc(prompt=0, local=0, hit=0, ext=0, cached=0)}, {"r1": rc()}, {"r1": rc(prompt=200, local=160)}]
    c = run(h, quiescent={"r1": rc(prompt=200, local=160)})
    assert c.ok and not c.stale and not c.deaths, c.violations


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
    c = run(
        [
            {"r1": rc(violations={"connector_negative": 0.0}, finished={"length": 4, "stop": 2})},
            {"r1": rc(finished={"length": 4})},
        ]
    )
    assert kinds(c) == ["decrease"] and "requests_finished{stop}" in c.violations[0].counter


def test_a_restarted_replica_is_a_new_series_not_a_reset():
    """The replacement replica starts from zero under a new ReplicaId: no violation."""
    h = [
        {"r1": rc(prompt=500, local=460)},
        {"r1": rc(prompt=500, local=460), "r2": rc("r2", prompt=10, local=10, hit=0, ext=0, cached=0)},
    ]
    assert run(h).ok
    # ... while the same id going back to zero is exactly what must be caught
    reset = run([{"r1": rc(prompt=500, local=460)}, {"r1": rc(prompt=10, local=10, hit=0, ext=0, cached=0)}])
    assert "decrease" in kinds(reset)


def test_stale_series_of_a_dead_replica_is_recognised():
    """r1 died mid-flight: its frozen counters break the identity but it is left out of quiescence checks."""
    mid_flight = rc(prompt=120, local=60)  # parts sum to 100, not 120
    c = run([{"r1": mid_flight, "r2": rc("r2")}], dead=frozenset({"r1"}), quiescent={"r1": mid_flight, "r2": rc("r2")})
    assert c.ok and c.stale == {"r1"}
    # the same numbers on a live replica are a violation
    live = run([{"r1": mid_flight}], quiescent={"r1": mid_flight})
    assert kinds(live) == ["sum_mismatch"]


def test_sum_mismatch_and_cached_exceeding_total_at_quiescence():
    c = run([{"r1": rc()}], quiescent={"r1": rc(prompt=100, local=61, cached=101)})
    assert kinds(c) == ["cached_exceeds_total", "sum_mismatch"]
    msg = next(v.message for v in c.violations if v.kind == "sum_mismatch")
    assert "101" in msg and "100" in msg


def test_not_quiescent_is_reported():
    c = run([], quiescent={"r1": rc(running=3)})
    assert kinds(c) == ["not_quiescent"]


class _LaggingExport:
    """A Ray node's metrics as the monitor sees them: values as of the last export (every 10 s, at t = 10k + 9.9)."""

    def __init__(self, monkeypatch, finished_at: float, requests: float):
        import load_tests.observe.monitor as monitor

        self.clock, self.finished_at, self.requests = 0.0, finished_at, requests
        interval = monitor.RAY_METRICS_EXPORT_INTERVAL_S

        async def scrape_once(mon, client):
            exported = (self.clock - 9.9) // interval * interval + 9.9  # the last export before now
            done = {"length": 4.0 + (self.requests if exported >= self.finished_at else 0.0)}
            return Snapshot(self.clock, {"r1": rc(finished=done)})

        async def sleep(seconds):
            self.clock += seconds

        monkeypatch.setattr(monitor.Monitor, "scrape_once", scrape_once)
        monkeypatch.setattr(monitor.asyncio, "sleep", sleep)
        monkeypatch.setattr(monitor.time, "monotonic", lambda: self.clock)


@pytest.mark.parametrize("settle_interval, sees_the_burst", [(6.0, False), (None, True)])
def test_quiescence_waits_past_one_metrics_export(monkeypatch, settle_interval, sees_the_burst):
    """A burst that ended between two exports (4 requests done at 0.5 s, next export at 9.9 s): two idle scrapes
    closer than one export interval (6 s here) agree on the values from before it, and a check of the burst's
    requests would see none of them; the default settle interval spans an export, so quiescence is reached on
    values that include it."""
    import asyncio

    from load_tests.observe.monitor import Monitor

    lag = _LaggingExport(monkeypatch, finished_at=0.5, requests=4.0)
    lag.clock = 1.0
    kwargs = {} if settle_interval is None else {"settle_interval": settle_interval}
    snap = asyncio.run(Monitor(["http://node/metrics"], InvariantChecker(), **kwargs).quiescent_check(90))
    assert (snap.replicas["r1"].requests_total == 8.0) is sees_the_burst, snap.replicas["r1"]


def test_accounting_violations_unexpected_vs_explained_by_faults():
    h = [{"r1": rc()}, {"r1": rc(violations={"connector_negative": 3.0})}]
    assert kinds(run(h)) == ["accounting_violation"]
    c = run(h, expected=("connector_negative",))
    assert c.ok and c.expected_violations == {"connector_negative": 3.0}
    # a violation already present at the first scrape counts too
    assert kinds(run([{"r1": rc(violations={"prefill_finalize_negative": 1.0})}])) == ["accounting_violation"]


def test_a_replica_reported_by_two_endpoints_is_an_error():
    c = run([{"r1": rc()}])
    assert c.ok
    dup = InvariantChecker()
    dup.observe(Snapshot(0.0, {"r1": rc(node="a")}, duplicates={"r1": ["a", "b"]}))
    assert kinds(dup) == ["duplicate_replica"] and "a, b" in dup.violations[0].message


# ---------------------------------------------------------------- scrapes


def test_one_failed_scrape_is_recorded_two_in_a_row_fail_the_run():
    ok = {"r1": rc()}
    once = run([ok, ok, ok], errors={1: {"http://n1/metrics": "ReadTimeout"}})
    assert once.ok and len(once.scrape_errors) == 1, "a single failed scrape is tolerated, and recorded"
    twice = run(
        [ok, ok, ok, ok], errors={1: {"http://n1/metrics": "ReadTimeout"}, 2: {"http://n1/metrics": "ReadTimeout"}}
    )
    assert SCRAPE_FAILURE_BOUND == 2 and kinds(twice) == ["scrape_failed"]
    v = twice.violations[0]
    assert v.counter == "http://n1/metrics" and "from t = 1 s" in v.message and "ReadTimeout" in v.message
    apart = run([ok] * 5, errors={1: {"u": "x"}, 3: {"u": "x"}})
    assert apart.ok, "failures with a good scrape between are not consecutive"


def test_an_endpoint_that_never_answers_fails_the_run_once_per_outage():
    c = run([{}] * 6, errors={t: {"http://n2/metrics": "ConnectError"} for t in range(6)})
    assert kinds(c) == ["scrape_failed"] and len(c.violations) == 1


# ---------------------------------------------------------------- deaths


@pytest.mark.parametrize(
    "gone",
    [
        {"r2": rc("r2", alive=False)},  # Ray: counters kept, gauges aged out
        {"r2": rc("r2", healthy=0.0)},  # Serve's controller marked it unhealthy / stopping
        {},  # every series gone while its endpoint answered
    ],
)
def test_a_replica_that_dies_mid_run_is_seen_in_the_data(gone):
    alive = {"r1": rc(), "r2": rc("r2", healthy=1.0)}
    c = run([alive, alive] + [{"r1": rc(), **gone}] * DEATH_BOUND)
    assert c.deaths == {"r2": 2.0} and "r2" in c.stale
    assert unexpected_deaths(c, []) == ["r2"]
    assert unexpected_deaths(c, [ReplicaKilled(t=1.5, replica="r2", pid=1)]) == [], "a planned kill is not"


def test_an_idle_ray_replica_is_alive_while_serve_says_healthy():
    """Ray's agent drops an idle replica's gauges after ~20 s; Serve's health gauge is what tells."""
    busy = {"r1": rc(healthy=1.0)}
    idle = {"r1": rc(healthy=1.0, alive=False)}
    c = run([busy, idle, idle, idle], quiescent=idle)
    assert not c.deaths and not c.stale and c.ok


def test_a_single_missed_export_is_not_a_death():
    alive = {"r1": rc(), "r2": rc("r2")}
    c = run([alive, {"r1": rc(), "r2": rc("r2", alive=False)}, alive, alive])
    assert not c.deaths and not c.stale


def test_an_unreadable_endpoint_is_not_a_death_of_its_replicas():
    alive = {"r1": rc(node="a"), "r2": rc("r2", node="b")}
    c = run([alive, {"r1": rc(node="a")}, {"r1": rc(node="a")}], errors={1: {"b": "timeout"}, 2: {"b": "timeout"}})
    assert not c.deaths and kinds(c) == ["scrape_failed"], "the failure is the endpoint's, and it is reported"


def test_series_dead_before_the_run_are_stale_not_deaths():
    """Against a long-lived deployment (--url) Ray still exports replicas that died before the run."""
    old = rc("old", prompt=120, local=60, alive=False)  # died mid-flight long ago: parts do not sum
    c = run([{"old": old, "r1": rc()}], quiescent={"old": old, "r1": rc()})
    assert c.ok and c.stale == {"old"} and not c.deaths


def test_an_unplanned_death_fails_the_run_and_is_named():
    alive = {"r1": rc(finished={"length": 1.0}), "r2": rc("r2", finished={"length": 0.5})}
    dead = {"r1": rc(finished={"length": 1.0}), "r2": rc("r2", alive=False, finished={"length": 0.5})}
    c = run([alive, alive, dead, dead])
    s = summarize([result(0, "ok")], 1, c, [], 10.0, Slo(), unexpected_deaths(c, []))
    assert not s.passed and any("r2 (seen dead from t = 2 s)" in f for f in s.failures)
    assert s.client_server.note, "with a death only the upper bound is sound"


# ---------------------------------------------------------------- requests and the verdict


def result(i, outcome, start=0.0, e2e=1.0, **kw):
    return RequestResult(
        index=i,
        outcome=outcome,
        start=start,
        e2e=e2e,
        ttft=0.1,
        chunks=5,
        completion_tokens=5,
        spec={"expect": "4xx" if outcome == "rejected" else "ok", "stream": True, **kw.pop("spec", {})},
        **kw,
    )


def test_cross_check_client_against_engine_counters():
    res = [result(0, "ok"), result(1, "ok"), result(2, "cancelled"), result(3, "rejected")]
    good = {"r1": rc(finished={"length": 2.0, "abort": 1.0})}
    assert server_cross_check(res, good, False).problems == []
    lost = {"r1": rc(finished={"length": 1.0})}
    assert "clients received 2" in server_cross_check(res, lost, False).problems[0]
    extra = {"r1": rc(finished={"length": 4.0})}
    assert server_cross_check(res, extra, False).problems, "more completions than requests"
    phantom = {"r1": rc(finished={"length": 2.0, "abort": 5.0})}
    assert "got past the router" in server_cross_check(res, phantom, False).problems[0]
    # an operation's own requests (a redeploy's probes, an affinity check) are counted by the engines too
    with_operator = {"r1": rc(finished={"length": 5.0, "abort": 1.0})}
    assert "more than the 2 complete" in server_cross_check(res, with_operator, False).problems[0]
    cross = server_cross_check(res, with_operator, False, operator_ok=3)
    assert cross.problems == [] and (cross.client_ok, cross.operator_ok) == (2, 3)


def test_a_request_counts_as_the_engine_requests_it_becomes():
    """A completion with a prompt list and n choices is one request to the client and prompts x n to the engines
    (the hostile-heavy control's 2 prompts x n 8 are 16): weighed so, the check holds; unweighed, the same engine
    counts read as phantom completions (what the control's first run reported)."""
    from load_tests.plan.workload import RequestSpec

    spec = RequestSpec(0, "/v1/completions", {"prompt": ["a", "b"], "n": 8}).to_json()
    assert spec["engine_requests"] == 16
    assert RequestSpec(0, "/v1/completions", {"prompt": [1, 2, 3]}).engine_requests == 1, "one prompt of token ids"
    assert RequestSpec(0, "/v1/chat/completions", {"messages": [], "n": 3}).engine_requests == 3
    heavy = result(0, "ok")
    heavy.spec = {**heavy.spec, "engine_requests": 16}
    res = [heavy, result(1, "ok")]
    assert server_cross_check(res, {"r1": rc(finished={"length": 17.0})}, False).problems == []
    assert server_cross_check(res, {"r1": rc(finished={"length": 16.0})}, False).problems, "one completion missing"
    unweighed = [result(0, "ok"), result(1, "ok")]
    assert (
        "got past the router"
        in server_cross_check(unweighed, {"r1": rc(finished={"length": 17.0})}, False).problems[-1]
    )


def summary_of(results, started=None, checker=None, faults=(), fault_checks=()):
    """Summarize with engine counters that agree with the clients (unless a checker is given)."""
    if checker is None:
        n_ok = sum(r.outcome == "ok" for r in results)
        checker = run([{}, {"r1": rc(finished={"length": float(n_ok)})}])  # baseline scrape, then the end
    return summarize(
        results,
        len(results) if started is None else started,
        checker,
        list(faults),
        10.0,
        Slo(),
        unexpected_deaths(checker, list(faults)),
        list(fault_checks),
    )


def test_verdict_fails_on_lost_and_unexpected_requests():
    ok = [result(i, "ok") for i in range(3)]
    assert summary_of(ok).passed
    assert not summary_of(ok, started=4).passed, "a request started but never finished is lost"
    truncated = summary_of([*ok, result(3, "truncated")])
    assert not truncated.passed and "lost" in truncated.failures[0]
    err = summary_of(
        ok
        + [
            result(3 + i, "server_error", start=5.0, error=f"Internal Server Error (Request ID: {rid})")
            for i, rid in enumerate(("0b2c-e4f1", "9a7d-03bc"))
        ]
        + [result(9, "stream_error", start=5.0, error="EngineCore encountered an issue.")]
    )
    assert not err.passed and err.errors_by_kind == {"server_error": 2, "stream_error": 1}
    line = next(f for f in err.failures if "unexpected error" in f)
    assert "(2x) server_error: Internal Server Error (Request ID: N)" in line, "ids blanked: one kind of error"
    assert "(1x) stream_error: EngineCore encountered an issue." in line, "the engine death is named"


def test_refusals_at_the_ingress_fail_a_run_that_changed_no_replica():
    """A retried refusal is not a lost request, but with the replica set standing still it says the ingress is
    broken; during a redeploy (HAProxy reloading its router and replica lists) it is what Serve does."""
    ok = [result(i, "ok") for i in range(3)]
    retried = result(3, "ok", ingress_refusals=["router_unreachable"])
    still = result(
        4,
        "server_error",
        status=503,
        error="Ingress request router failed: router_unreachable",
        ingress_refusals=["router_unreachable"] * 3,
    )
    steady = summary_of([*ok, retried])
    assert steady.ingress_retries.model_dump() == {
        "requests": 1,
        "refusals": {"router_unreachable": 1},
        "answered": 1,
        "in_change_windows": 0,
        "outside_change_windows": 1,
        "budget": 0,
        "windows": [],
    }
    assert not steady.passed and "refused at the ingress" in steady.failures[0]
    redeploy = Redeployed(t=0.0, step=Redeploy(after_s=0), by="serve deploy", replicas_before=[])
    assert summary_of([*ok, retried], faults=[redeploy]).passed, "answered on a retry while replicas changed"
    failed = summary_of([*ok, retried, still], faults=[redeploy])
    assert failed.ingress_retries.answered == 1 and failed.ingress_retries.refusals == {"router_unreachable": 4}
    assert not failed.passed and failed.errors_by_kind == {"server_error": 1}, "refused after every retry"
    assert not summary_of(
        [*ok, retried], faults=[OperationFailed(t=1.0, step="redeploy", error="StepError: no")]
    ).passed


def test_every_replica_changing_operation_may_meet_ingress_refusals():
    from typing import get_args

    from load_tests.plan.steps import Operation
    from load_tests.results.events import REPLICA_SET_CHANGES

    kinds = {get_args(m.model_fields["kind"].annotation)[0] for m in get_args(get_args(Operation)[0])}
    assert kinds | {"replica_kill"} == set(REPLICA_SET_CHANGES)


def test_errors_around_a_replica_kill_are_explained():
    fault = ReplicaKilled(t=5.0, replica="r9", pid=1)
    res = [result(0, "ok"), result(1, "stream_error", start=4.0, e2e=2.0), result(2, "server_error", start=60.0)]
    s = summary_of(res, faults=[fault])
    assert s.errors_explained_by_faults == {"stream_error": 1}
    assert s.errors_by_kind == {"server_error": 1} and not s.passed, "an error long after the kill is not"


def test_streams_cut_by_a_planned_kill_are_explained_not_lost():
    """Direct streaming: a killed replica cuts its streams (no error event); in flight at the kill = explained."""
    fault = ReplicaKilled(t=5.0, replica="r9", pid=1)
    cut = [result(1, "truncated", start=3.0, e2e=2.5), result(2, "transport_error", start=4.0, e2e=1.5)]
    s = summary_of([result(0, "ok"), *cut], faults=[fault])
    assert s.passed, s.failures
    assert s.errors_explained_by_faults == {"truncated": 1, "transport_error": 1}
    before = summary_of([result(0, "ok"), result(1, "truncated", start=1.0, e2e=2.0)], faults=[fault])
    assert not before.passed and "lost" in before.failures[0], "a stream cut before the kill is lost"
    no_kill = summary_of([result(0, "ok"), *cut])
    assert not no_kill.passed, "without a planned kill the same cuts are failures"


def test_bad_request_must_name_its_field():
    good = result(
        0,
        "rejected",
        status=400,
        error="vllm_xargs.fuzz_strength must be >= 0",
        error_param="vllm_xargs.fuzz_strength",
        spec={"expect_status": 400, "expect_param": "vllm_xargs.fuzz_strength"},
    )
    vague = result(
        1,
        "rejected",
        status=400,
        error="bad request",
        spec={"expect_status": 400, "expect_param": "vllm_xargs.fuzz_mode"},
    )
    ok = result(2, "ok")
    assert summary_of([good, ok]).passed
    s = summary_of([good, vague, ok])
    assert not s.passed and s.bad_requests.problems[0].want_param == "vllm_xargs.fuzz_mode"


def test_verdict_fails_on_invariant_violation():
    checker = run([{}, {"r1": rc(finished={"length": 1.0})}, {"r1": rc(prompt=50, local=10, finished={"length": 1.0})}])
    s = summary_of([result(0, "ok")], checker=checker)
    assert not s.passed and s.invariants.first_violation.kind == "decrease"
    assert any("first decrease at t = 2 s" in f for f in s.failures), "the failure names the invariant and when"


@pytest.mark.parametrize("outcome", ["unexpected_4xx", "unexpected_ok", "transport_error", "timeout"])
def test_every_failure_outcome_fails_the_run(outcome):
    assert not summary_of([result(0, "ok"), result(1, outcome, start=3.0)]).passed


def test_cross_check_counts_only_this_runs_traffic():
    """Against a long-lived deployment the engines' counts start from the scrape before the run."""
    res = [result(0, "ok"), result(1, "ok")]
    before = {"r1": rc(finished={"length": 100.0})}
    after = {"r1": rc(finished={"length": 102.0})}
    assert server_cross_check(res, after, False, before).problems == []
    assert server_cross_check(res, after, False).problems, "without the baseline the old traffic shows"
    assert server_cross_check(res, {"r1": rc(finished={"length": 101.0})}, False, before).problems


# ---------------------------------------------------------------- planned faults


def fault_run(end: dict[str, ReplicaCounters], start: dict[str, ReplicaCounters] | None = None):
    start = start if start is not None else {k: rc(k, finished={"length": 0.0}) for k in end}
    return run([start, end, end])


FIRED: dict[str, dict[str, Any]] = {
    "load_failures": dict(injections={"load_failure": 5.0}, corrections={"after_load_failure": 3.0}),
    "load_delays": dict(injections={"load_delay": 40.0}),
    "lying_connector": dict(
        injections={"lie_negative": 2.0, "lie_exceeds_prompt": 1.0, "lie_changing": 1.0},
        violations={"connector_negative": 2.0, "connector_exceeds_prompt": 1.0},
    ),
    "preemption_storm": dict(preemptions=7.0),
}


@pytest.mark.parametrize("fault", sorted(FIRED))
def test_a_planned_fault_must_show_in_the_data(fault):
    fired = fault_run({"r1": rc(**FIRED[fault])})
    [check] = check_planned_faults((fault,), fired, [], accounting_on=True)
    assert check.fired and check.ok, check
    quiet = fault_run({"r1": rc()})
    [check] = check_planned_faults((fault,), quiet, [], accounting_on=True)
    assert not check.fired and not check.ok and "died" not in check.evidence
    s = summary_of([result(0, "ok")], checker=run([{}, {"r1": rc(finished={"length": 1.0})}]), fault_checks=[check])
    assert not s.passed and any(f"planned fault {fault} did not fire" in f for f in s.failures)


def test_a_fault_that_could_not_show_because_its_replica_died_says_so():
    alive = {"r1": rc(healthy=1.0)}
    dead = {"r1": rc(healthy=0.0)}
    [check] = check_planned_faults(("lying_connector",), run([alive, dead, dead]), [], accounting_on=False)
    assert not check.fired and "1 replica(s) died during the run" in check.evidence


def test_a_fault_injected_before_the_run_does_not_count():
    before = {"r1": rc(injections={"load_delay": 40.0}, finished={"length": 0.0})}
    [check] = check_planned_faults(
        ("load_delays",), fault_run({"r1": rc(injections={"load_delay": 40.0})}, before), [], accounting_on=True
    )
    assert not check.fired


@pytest.mark.parametrize("fault, handled_by", [("load_failures", "corrections"), ("lying_connector", "violations")])
def test_a_fault_that_fired_must_be_handled_on_each_replica_that_had_it(fault, handled_by):
    fields = dict(FIRED[fault])
    both = fault_run({"r1": rc(**fields), "r2": rc("r2", **fields)})
    assert all(c.ok for c in check_planned_faults((fault,), both, [], accounting_on=True))
    unhandled = dict(fields, **{handled_by: {}})
    one_short = fault_run({"r1": rc(**fields), "r2": rc("r2", **unhandled)})
    [check] = check_planned_faults((fault,), one_short, [], accounting_on=True)
    assert check.fired and not check.ok and check.problems[0].startswith("replica r2:"), check
    [off] = check_planned_faults((fault,), one_short, [], accounting_on=False)
    assert off.ok and "accounting patch off" in off.evidence, "stock accounting has no counter to show it"


def test_every_impossible_lie_must_be_clamped():
    one_missed = fault_run({"r1": rc(injections={"lie_negative": 3.0}, violations={"connector_negative": 2.0})})
    [check] = check_planned_faults(("lying_connector",), one_missed, [], accounting_on=True)
    assert not check.ok and "told 3 x lie_negative but only 2 x connector_negative" in check.problems[0]


def test_changing_lies_need_no_clamp():
    only_changing = fault_run({"r1": rc(injections={"lie_changing": 4.0})})
    [check] = check_planned_faults(("lying_connector",), only_changing, [], accounting_on=True)
    assert check.ok, check


def test_replica_kill_needs_the_victim_dead_and_a_replacement_serving():
    kill = ReplicaKilled(t=1.5, replica="r2", pid=1)
    before = {"r1": rc(finished={"length": 1.0}), "r2": rc("r2", finished={"length": 1.0})}
    gone = {"r1": rc(finished={"length": 3.0}), "r2": rc("r2", alive=False, finished={"length": 1.0})}
    replaced = dict(gone, r3=rc("r3", finished={"length": 2.0}))
    good = run([before, before, gone, replaced, replaced])
    [check] = check_planned_faults(("replica_kill",), good, [kill], accounting_on=True)
    assert check.ok and "r3" in check.per_replica, check
    assert unexpected_deaths(good, [kill]) == []

    never_died = run([before, before, dict(before, r3=rc("r3"))] * 2)
    [check] = check_planned_faults(("replica_kill",), never_died, [kill], accounting_on=True)
    assert not check.ok and "never showed it dead" in check.problems[0]

    no_replacement = run([before, before, gone, gone, gone])
    [check] = check_planned_faults(("replica_kill",), no_replacement, [kill], accounting_on=True)
    assert not check.ok and "no replacement served" in check.problems[0]

    [check] = check_planned_faults(("replica_kill",), good, [], accounting_on=True)
    assert not check.fired and check.evidence == "the run killed no replica"


def test_scenarios_plan_what_they_inject():
    from load_tests.plan.scenarios import SCENARIOS

    assert SCENARIOS["chaos"].planned_faults == (
        "load_failures",
        "load_delays",
        "lying_connector",
        "preemption_storm",
        "replica_kill",
    )
    assert SCENARIOS["chaos-lite"].planned_faults == (
        "load_failures",
        "load_delays",
        "lying_connector",
        "preemption_storm",
    )
    assert SCENARIOS["smoke"].planned_faults == () and SCENARIOS["smoke"].expected_violation_kinds == ()
    assert "connector_negative" in SCENARIOS["chaos"].expected_violation_kinds
    with pytest.raises(ValueError, match="load_failure_rte"):
        SCENARIOS["chaos"].model_validate({**SCENARIOS["chaos"].model_dump(), "faults": {"load_failure_rte": 0.1}})
