"""A run's numbers: per-request results and the monitor's findings turned into a
:class:`~load_tests.results.models.RunSummary`.

Pure functions over :class:`~load_tests.load.client.RequestResult` lists and an
:class:`~load_tests.observe.monitor.InvariantChecker`; no I/O. :func:`run_statistics`
computes every figure of ``summary.json`` (outcomes, throughput, latencies,
errors, invariants, replicas, the client/server cross-check, the planned
faults' evidence); whether they fail the run is :mod:`load_tests.judge.verdict`'s
question; :func:`summarize` is the two together, what the CLI reports.

A failed request that was in flight when the run itself killed a replica,
or started within :data:`KILL_GRACE_S` after the kill, is *explained* and
counted apart (``errors_explained_by_faults``): with direct streaming a
killed replica cuts its streams (the client sees ``truncated`` or a
transport error, no error event), and until Serve notices the death new
requests can still be routed to it. An explained request is never counted
as ``ok``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from ..load.client import RequestResult
from ..load.client_cost import LAG_BOUND_S, ClientCostSample
from ..load.outcomes import FAILURE_OUTCOMES
from ..observe.counters import ReplicaCounters
from ..observe.monitor import InvariantChecker
from ..plan.slo import Slo
from ..results.events import CUTTING, Event
from ..results.models import (
    BadRequestProblem,
    BadRequests,
    ClientCost,
    ClientServer,
    FaultCheck,
    HostileVerdict,
    Invariants,
    Percentiles,
    ProbeVerdict,
    ReplicaRecord,
    RunSummary,
)
from .figures import latency, percentiles, throughput
from .ingress import ingress_retries
from .server_latency import server_latency
from .verdict import verdict

# The client's requests/s and the engines' over the same window agree within this share (issue 47).
RATE_BOUND = 0.05
# After a kill, how long new requests may still fail because of it (Serve takes a few seconds to see a
# replica die and stop routing to it).
KILL_GRACE_S = 30.0


def explained_by_fault(r: RequestResult, events: Sequence[Event], grace_s: float = KILL_GRACE_S) -> bool:
    """A failed request that was in flight at a replica kill or node loss (:data:`CUTTING`), or started within
    ``grace_s`` after it. A redeploy or a scale-down explains nothing: Serve drains the replicas it stops."""
    end = r.start + (r.e2e or 0.0)
    return any(f.kind in CUTTING and r.start <= f.t + grace_s and end >= f.t for f in events)


def bad_request_problems(results: list[RequestResult]) -> list[BadRequestProblem]:
    """Rejected bad requests whose error does not carry the expected status or name the field."""
    problems = []
    for r in results:
        if r.outcome != "rejected":
            continue
        want_status, want_param = r.spec.get("expect_status"), r.spec.get("expect_param")
        named = want_param is None or r.error_param == want_param or (want_param in (r.error or ""))
        if (want_status and r.status != want_status) or not named:
            problems.append(
                BadRequestProblem(
                    index=r.index,
                    status=r.status,
                    want_status=want_status,
                    want_param=want_param,
                    error_param=r.error_param,
                    error=r.error,
                )
            )
    return problems


def server_cross_check(
    results: list[RequestResult],
    final: dict[str, ReplicaCounters],
    replicas_died: bool,
    baseline: dict[str, ReplicaCounters] | None = None,
    operator_ok: int = 0,
    wall_s: float = 0.0,
    output_tokens: int = 0,
) -> ClientServer:
    """Compare what the clients saw complete with what the engines counted as finished.

    Each request that reaches an engine finishes there exactly once (stop,
    length, abort, error, repetition). So, summed over every replica ever
    seen: completed-by-engine >= completed-by-client, and every finished
    request was one the clients sent. A client request counts as the engine
    requests it becomes (``engine_requests`` of its spec: prompts x ``n``). A cancelled stream may still have
    finished in the engine before the abort arrived, hence the range. The
    engines' counts are taken relative to ``baseline`` (the scrape before the
    run), so earlier traffic on a long-lived deployment does not count.
    ``operator_ok``: complete answers to requests the run's operations sent
    beside the load (not in ``results``; the engines count them too).

    Beside the counts, both sides' rates over the load's window ``wall_s`` (the
    client's output tokens ``output_tokens``, the engines' generated tokens),
    and whether the client's requests/s lies within :data:`RATE_BOUND` of the
    engines' (against the client's range: complete, up to complete +
    cancelled).
    """
    baseline = baseline or {}

    def weight(r: RequestResult) -> int:  # engine requests per client request (a prompt list, n choices)
        return int(r.spec.get("engine_requests", 1))

    client_ok = sum(weight(r) for r in results if r.outcome == "ok")
    ok = client_ok + operator_ok  # every complete answer the engines gave, the load's and the operations'
    cancelled = sum(weight(r) for r in results if r.outcome == "cancelled")
    sent_to_engines = sum(weight(r) for r in results if r.outcome not in ("rejected",)) + operator_ok
    completed = sum(_finished_since(baseline, k, rc, ("stop", "length", "repetition")) for k, rc in final.items())
    finished = sum(_finished_since(baseline, k, rc, None) for k, rc in final.items())
    generated = sum(
        rc.generation_tokens - (baseline[k].generation_tokens if k in baseline else 0.0) for k, rc in final.items()
    )

    def rate(n: float) -> float:
        return n / wall_s if wall_s else 0.0

    out = ClientServer(
        client_ok=client_ok,
        client_cancelled=cancelled,
        engine_completed=completed,
        engine_finished=finished,
        engine_generation_tokens=generated,
        wall_s=wall_s,
        client_requests_per_s=rate(ok),
        engine_requests_per_s=rate(completed),
        client_output_tokens_per_s=rate(output_tokens),
        engine_output_tokens_per_s=rate(generated),
        agrees=(replicas_died or ok * (1 - RATE_BOUND) <= completed)
        and completed <= (ok + cancelled) * (1 + RATE_BOUND),
        sent_past_router=sent_to_engines,
        operator_ok=operator_ok,
    )
    _note_disagreements(out, ok, cancelled, replicas_died)
    return out


def _finished_since(
    baseline: dict[str, ReplicaCounters], key: str, rc: ReplicaCounters, reasons: tuple[str, ...] | None
) -> float:
    """The requests replica ``key`` finished since ``baseline``, for the given finish reasons (``None``: all)."""
    before = baseline.get(key)
    return sum(
        v - (before.requests_finished.get(reason, 0.0) if before else 0.0)
        for reason, v in rc.requests_finished.items()
        if reasons is None or reason in reasons
    )


def _note_disagreements(out: ClientServer, ok: int, cancelled: int, replicas_died: bool) -> None:
    """The cross-check's bounds on ``out``'s counts: a problem for each one broken, or the note of why the lower
    bound is not checked."""
    completed, finished, sent_to_engines = out.engine_completed, out.engine_finished, out.sent_past_router
    if replicas_died:
        # A dead replica's last export can lag its last completions by a few
        # seconds, so only the upper bound is sound.
        out.note = "a replica died: only engine_finished <= sent_past_router is checked"
    elif completed < ok:
        out.problems.append(f"engines completed {completed:g} requests but clients received {ok} complete answers")
    elif completed > ok + cancelled:
        out.problems.append(
            f"engines completed {completed:g} requests, more than the {ok} complete + "
            f"{cancelled} cancelled the clients saw"
        )
    if finished > sent_to_engines:
        out.problems.append(f"engines finished {finished:g} requests but only {sent_to_engines} got past the router")


def error_signature(r: RequestResult) -> str:
    """An error message with every word holding a digit (numbers, request ids) blanked: requests that failed the
    same way share it."""
    return re.sub(r"[\w-]*\d[\w-]*", "N", f"{r.outcome}: {r.error or r.status}")[:160]


def run_statistics(
    results: list[RequestResult],
    started: int,
    checker: InvariantChecker,
    events: Sequence[Event],
    wall_s: float,
    slo: Slo,
    deaths: list[str],
    fault_checks: Sequence[FaultCheck] = (),
    operator_ok: int = 0,
    probes: ProbeVerdict | None = None,
    hostile: HostileVerdict | None = None,
    cost: ClientCostSample | None = None,
) -> RunSummary:
    """Every figure of the run, with no verdict yet (``failures`` empty).

    ``deaths``: replicas that died without the run killing them
    (:func:`load_tests.judge.departures.unexpected_deaths`); ``probes``: the greedy probes' comparison
    (:func:`load_tests.judge.probes.probe_verdict`), for a run that sent them; ``hostile``: the hostile
    scenario's judgement (:func:`load_tests.judge.hostile.judge_hostile`); ``cost``: what the client itself took
    (its CPU and its loop's lag), which decides whether its ITL / TPOT are reported."""
    outcomes: Counter[str] = Counter(r.outcome for r in results)
    lost = started - len(results)
    if lost:
        outcomes["lost"] += lost
    explained, unexplained = _split_failures(results, events)
    ok = [r for r in results if r.outcome == "ok"]
    final = checker.final()
    cross = server_cross_check(
        results,
        final,
        replicas_died=bool(checker.deaths or any(f.kind in CUTTING for f in events) or deaths),
        baseline=checker.baseline(),
        operator_ok=operator_ok,
        wall_s=wall_s,
        output_tokens=sum(r.output_tokens for r in ok),
    )
    server = server_latency(final, checker.baseline())
    lag = Percentiles(**percentiles(cost.lags), requests=None) if cost is not None else None
    return RunSummary(
        wall_s=wall_s,
        started=started,
        outcomes=dict(outcomes),
        throughput=throughput(results, wall_s, slo),
        slo=slo,
        latency_s=latency(ok, lag.p99 if lag is not None else None),
        server_latency_s=server,
        client_cost=_client_cost(cost, lag, started),
        errors_by_kind=dict(Counter(r.outcome for r in unexplained)),
        errors_by_message=dict(Counter(error_signature(r) for r in unexplained).most_common(5)),
        errors_explained_by_faults=dict(Counter(r.outcome for r in explained)),
        ingress_retries=ingress_retries(results, events),
        first_unexpected_errors=[r.to_json() for r in unexplained[:5]],
        bad_requests=_bad_requests(results),
        faults=list(events),
        invariants=_invariants(checker),
        replicas=_replicas(checker, final),
        unexpected_replica_deaths=deaths,
        planned_faults=list(fault_checks),
        client_server=cross,
        failures=[],
        probes=probes,
        hostile=hostile,
    )


def _split_failures(
    results: list[RequestResult], events: Sequence[Event]
) -> tuple[list[RequestResult], list[RequestResult]]:
    """The failed requests, split into those a fault explains (:func:`explained_by_fault`) and the rest."""
    explained: list[RequestResult] = []
    unexplained: list[RequestResult] = []
    for r in results:
        if r.outcome in FAILURE_OUTCOMES:
            (explained if explained_by_fault(r, events) else unexplained).append(r)
    return explained, unexplained


def _client_cost(cost: ClientCostSample | None, lag: Percentiles | None, started: int) -> ClientCost | None:
    """What the client itself took, per request started; ``None`` when the run did not measure it."""
    if cost is None or lag is None:
        return None
    return ClientCost(
        cpu_s=cost.cpu_s,
        cpu_s_per_request=cost.cpu_s / started if started else 0.0,
        loop_lag_s=lag,
        runqueue_wait_s=cost.runqueue_wait_s,
        lag_bound_s=LAG_BOUND_S,
    )


def _bad_requests(results: list[RequestResult]) -> BadRequests:
    """The deliberately bad requests sent, those refused naming the field, and the first problems."""
    bad = bad_request_problems(results)
    return BadRequests(
        sent=sum(r.spec.get("expect") == "4xx" for r in results),
        rejected_naming_the_field=sum(r.outcome == "rejected" for r in results) - len(bad),
        problems=bad[:10],
    )


def _invariants(checker: InvariantChecker) -> Invariants:
    """The monitor's findings: violations by kind (the first in full), the scrapes and how long they took."""
    return Invariants(
        ok=checker.ok,
        violations=len(checker.violations),
        by_kind=dict(Counter(v.kind for v in checker.violations)),
        first_violation=checker.violations[0] if checker.violations else None,
        expected_accounting_violations=checker.expected_violations,
        scrapes=len(checker.history),
        scrape_errors=checker.scrape_errors[:10],
        failed_scrapes=len(checker.scrape_errors),
        scrape_seconds=Percentiles(**percentiles([h.scrape_s for h in checker.history[1:-1]]), requests=None),
        first_scrape_t=checker.history[0].t if checker.history else None,
        last_scrape_t=checker.history[-1].t if checker.history else None,
    )


def _replicas(checker: InvariantChecker, final: dict[str, ReplicaCounters]) -> dict[str, ReplicaRecord]:
    """Every replica ever seen: its last counters, and whether it went stale or died."""
    return {
        k: ReplicaRecord(
            stale=k in checker.stale,
            died_at=checker.deaths.get(k),
            first_alive_at=checker.first_alive.get(k),
            node=rc.node,
            prompt_tokens=rc.prompt_tokens,
            by_source=rc.by_source,
            requests_finished=rc.requests_finished,
            preemptions=rc.preemptions,
            violations=rc.violations,
            corrections=rc.corrections,
            injections=rc.injections,
        )
        for k, rc in final.items()
    }


def summarize(
    results: list[RequestResult],
    started: int,
    checker: InvariantChecker,
    events: Sequence[Event],
    wall_s: float,
    slo: Slo,
    deaths: list[str],
    fault_checks: Sequence[FaultCheck] = (),
    operator_ok: int = 0,
    probes: ProbeVerdict | None = None,
    hostile: HostileVerdict | None = None,
    cost: ClientCostSample | None = None,
) -> RunSummary:
    """:func:`run_statistics` with its verdict (``failures``, :func:`load_tests.judge.verdict.verdict`)."""
    summary = run_statistics(
        results, started, checker, events, wall_s, slo, deaths, fault_checks, operator_ok, probes, hostile, cost
    )
    summary.failures = verdict(summary, checker.violations)
    return summary
