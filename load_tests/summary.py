"""A run's numbers: per-request results and the monitor's findings turned into a :class:`~load_tests.results.RunSummary`.

Pure functions over :class:`~load_tests.client.RequestResult` lists and an
:class:`~load_tests.monitor.InvariantChecker`; no I/O. :func:`run_statistics`
computes every figure of ``summary.json`` (outcomes, throughput, latencies,
errors, invariants, replicas, the client/server cross-check, the planned
faults' evidence); whether they fail the run is :mod:`load_tests.verdict`'s
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
from typing import TYPE_CHECKING, Any

import numpy as np

from .client import RequestResult
from .monitor import InvariantChecker
from .outcomes import FAILURE_OUTCOMES
from .counters import ReplicaCounters
from .results import (BadRequestProblem, BadRequests, ClientServer, Fault, IngressRetries, Invariants, Latency,
                      Percentiles, ReplicaRecord, RunSummary, Throughput)
from .scenarios import Slo
from .verdict import verdict

if TYPE_CHECKING:
    from .fault_evidence import FaultCheck

__all__ = ["Fault", "Slo", "percentiles", "latency", "throughput", "run_statistics", "summarize", "server_cross_check", "unexpected_deaths",
           "explained_by_fault", "ingress_retries", "bad_request_problems", "error_signature"]

PERCENTILES = (50, 90, 95, 99)
# After a kill, how long new requests may still fail because of it (Serve takes a few seconds to see a
# replica die and stop routing to it).
KILL_GRACE_S = 30.0


def percentiles(values: Sequence[float], points: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"p50": ..., ..., "mean": ..., "count": n}`` of ``values`` (None each when there are none): every latency
    figure of the load tests and the benchmarks, with how many values it covers."""
    if not len(values):
        return {f"p{p}": None for p in points} | {"mean": None, "count": 0}
    arr = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(arr, p)) for p in points} | {"mean": float(arr.mean()), "count": len(arr)}


def latency(ok: Sequence[RequestResult]) -> Latency:
    """The latency rows over the complete answers ``ok``, each over the requests that have the figure."""
    def row(per_request: list[list[float]]) -> Percentiles:
        have = [xs for xs in per_request if xs]
        return Percentiles(**percentiles([x for xs in have for x in xs]), requests=len(have))

    return Latency(ttft=row([[r.ttft] if r.ttft is not None else [] for r in ok]),
                   itl=row([list(r.itl) if r.ttft is not None else [] for r in ok]),
                   tpot=row([[r.tpot] if r.tpot is not None else [] for r in ok]),
                   e2e=row([[r.e2e] if r.e2e is not None else [] for r in ok]))


def throughput(results: Sequence[RequestResult], wall_s: float, slo: Slo) -> Throughput:
    """Completed requests, output tokens and SLO goodput per second of ``wall_s`` (every request judged by
    :meth:`Slo.met`)."""
    ok = [r for r in results if r.outcome == "ok"]
    met = sum(slo.met(r) for r in ok)

    def rate(n: float) -> float:
        return n / wall_s if wall_s else 0.0

    return Throughput(completed=len(ok), requests_per_s=rate(len(ok)),
                      output_tokens_per_s=rate(sum(r.output_tokens for r in ok)), slo_met=met,
                      goodput_requests_per_s=rate(met))


# Faults that cut what is in flight on purpose: a replica kill, a node loss. A redeploy or a scale-down explains
# nothing: Serve drains the replicas it stops, so every request must complete.
CUTTING_FAULTS = ("replica_kill", "node_loss")


def explained_by_fault(r: RequestResult, faults: list[Fault], grace_s: float = KILL_GRACE_S) -> bool:
    """A failed request that was in flight at a replica kill or node loss, or started within ``grace_s`` after it."""
    end = r.start + (r.e2e or 0.0)
    return any(f.kind in CUTTING_FAULTS and r.start <= f.t + grace_s and end >= f.t for f in faults)


def ingress_retries(results: Sequence[RequestResult]) -> IngressRetries:
    """The requests refused at the ingress and sent again (:mod:`load_tests.client`), and how they ended."""
    refused = [r for r in results if r.ingress_refusals]
    return IngressRetries(requests=len(refused),
                          refusals=dict(Counter(reason for r in refused for reason in r.ingress_refusals)),
                          answered=sum(r.outcome != "server_error" for r in refused))


def bad_request_problems(results: list[RequestResult]) -> list[BadRequestProblem]:
    """Rejected bad requests whose error does not carry the expected status or name the field."""
    problems = []
    for r in results:
        if r.outcome != "rejected":
            continue
        want_status, want_param = r.spec.get("expect_status"), r.spec.get("expect_param")
        named = want_param is None or r.error_param == want_param or (want_param in (r.error or ""))
        if (want_status and r.status != want_status) or not named:
            problems.append(BadRequestProblem(index=r.index, status=r.status, want_status=want_status,
                                              want_param=want_param, error_param=r.error_param, error=r.error))
    return problems


def server_cross_check(results: list[RequestResult], final: dict[str, ReplicaCounters],
                       replicas_died: bool, baseline: dict[str, ReplicaCounters] | None = None,
                       operator_ok: int = 0) -> ClientServer:
    """Compare what the clients saw complete with what the engines counted as finished.

    Each request that reaches an engine finishes there exactly once (stop,
    length, abort, error, repetition). So, summed over every replica ever
    seen: completed-by-engine >= completed-by-client, and every finished
    request was one the clients sent. A cancelled stream may still have
    finished in the engine before the abort arrived, hence the range. The
    engines' counts are taken relative to ``baseline`` (the scrape before the
    run), so earlier traffic on a long-lived deployment does not count.
    ``operator_ok``: complete answers to requests the run's operations sent
    beside the load (not in ``results``; the engines count them too).
    """
    baseline = baseline or {}

    def delta(key: str, rc: ReplicaCounters, reasons: tuple[str, ...] | None) -> float:
        before = baseline.get(key)
        return sum(v - (before.requests_finished.get(reason, 0.0) if before else 0.0)
                   for reason, v in rc.requests_finished.items() if reasons is None or reason in reasons)

    client_ok = sum(r.outcome == "ok" for r in results)
    ok = client_ok + operator_ok  # every complete answer the engines gave, the load's and the operations'
    cancelled = sum(r.outcome == "cancelled" for r in results)
    sent_to_engines = sum(r.outcome not in ("rejected",) for r in results) + operator_ok
    completed = sum(delta(k, rc, ("stop", "length", "repetition")) for k, rc in final.items())
    finished = sum(delta(k, rc, None) for k, rc in final.items())
    out = ClientServer(client_ok=client_ok, client_cancelled=cancelled, engine_completed=completed,
                       engine_finished=finished, sent_past_router=sent_to_engines, operator_ok=operator_ok)
    if replicas_died:
        # A dead replica's last export can lag its last completions by a few
        # seconds, so only the upper bound is sound.
        out.note = "a replica died: only engine_finished <= sent_past_router is checked"
    elif completed < ok:
        out.problems.append(f"engines completed {completed:g} requests but clients received {ok} complete answers")
    elif completed > ok + cancelled:
        out.problems.append(f"engines completed {completed:g} requests, more than the {ok} complete + "
                            f"{cancelled} cancelled the clients saw")
    if finished > sent_to_engines:
        out.problems.append(f"engines finished {finished:g} requests but only {sent_to_engines} got past the router")
    return out


def error_signature(r: RequestResult) -> str:
    """An error message with every word holding a digit (numbers, request ids) blanked: requests that failed the
    same way share it."""
    return re.sub(r"[\w-]*\d[\w-]*", "N", f"{r.outcome}: {r.error or r.status}")[:160]


def unexpected_deaths(checker: InvariantChecker, faults: list[Fault], listed_dead: list[str] = ()) -> list[str]:
    """Replicas that died (seen in the data, or missing from Ray's replica list) without the run killing them,
    losing their node, or an operation retiring them (:func:`load_tests.operations.planned_departures`)."""
    from .operations import planned_departures

    killed = {f.detail.get("replica") for f in faults if f.kind == "replica_kill"}
    planned = set(planned_departures(checker, faults, list(listed_dead)))
    return sorted((set(checker.deaths) | set(listed_dead)) - killed - planned)


def run_statistics(results: list[RequestResult], started: int, checker: InvariantChecker, faults: list[Fault],
                   wall_s: float, slo: Slo, deaths: list[str], fault_checks: list[FaultCheck] = (),
                   operator_ok: int = 0) -> RunSummary:
    """Every figure of the run, with no verdict yet (``failures`` empty).

    ``deaths``: replicas that died without the run killing them (:func:`unexpected_deaths`)."""
    outcomes = Counter(r.outcome for r in results)
    lost = started - len(results)
    if lost:
        outcomes["lost"] += lost
    explained, unexplained = [], []
    for r in results:
        if r.outcome in FAILURE_OUTCOMES:
            (explained if explained_by_fault(r, faults) else unexplained).append(r)
    ok = [r for r in results if r.outcome == "ok"]
    final = checker.final()
    cross = server_cross_check(results, final, replicas_died=bool(checker.deaths or any(
        f.kind in CUTTING_FAULTS for f in faults) or deaths), baseline=checker.baseline(), operator_ok=operator_ok)
    bad = bad_request_problems(results)
    return RunSummary(
        wall_s=wall_s,
        started=started,
        outcomes=dict(outcomes),
        throughput=throughput(results, wall_s, slo),
        slo=slo,
        latency_s=latency(ok),
        errors_by_kind=dict(Counter(r.outcome for r in unexplained)),
        errors_by_message=dict(Counter(error_signature(r) for r in unexplained).most_common(5)),
        errors_explained_by_faults=dict(Counter(r.outcome for r in explained)),
        ingress_retries=ingress_retries(results),
        first_unexpected_errors=[r.to_json() for r in unexplained[:5]],
        bad_requests=BadRequests(sent=sum(r.spec.get("expect") == "4xx" for r in results),
                                 rejected_naming_the_field=sum(r.outcome == "rejected" for r in results) - len(bad),
                                 problems=bad[:10]),
        faults=faults,
        invariants=Invariants(
            ok=checker.ok, violations=len(checker.violations),
            by_kind=dict(Counter(v.kind for v in checker.violations)),
            first_violation=checker.violations[0] if checker.violations else None,
            expected_accounting_violations=checker.expected_violations,
            scrapes=len(checker.history), scrape_errors=checker.scrape_errors[:10],
            failed_scrapes=len(checker.scrape_errors),
            scrape_seconds=Percentiles(**percentiles([h.scrape_s for h in checker.history[1:-1]]), requests=None),
            first_scrape_t=checker.history[0].t if checker.history else None,
            last_scrape_t=checker.history[-1].t if checker.history else None),
        replicas={k: ReplicaRecord(stale=k in checker.stale, died_at=checker.deaths.get(k),
                                   first_alive_at=checker.first_alive.get(k), node=rc.node,
                                   prompt_tokens=rc.prompt_tokens, by_source=rc.by_source,
                                   requests_finished=rc.requests_finished, preemptions=rc.preemptions,
                                   violations=rc.violations, corrections=rc.corrections, injections=rc.injections)
                  for k, rc in final.items()},
        unexpected_replica_deaths=deaths,
        planned_faults=list(fault_checks),
        client_server=cross,
        failures=[],
    )


def summarize(results: list[RequestResult], started: int, checker: InvariantChecker, faults: list[Fault],
              wall_s: float, slo: Slo, deaths: list[str], fault_checks: list[FaultCheck] = (),
              operator_ok: int = 0) -> RunSummary:
    """:func:`run_statistics` with its verdict (``failures``, :func:`load_tests.verdict.verdict`)."""
    summary = run_statistics(results, started, checker, faults, wall_s, slo, deaths, fault_checks, operator_ok)
    summary.failures = verdict(summary, checker.violations)
    return summary
