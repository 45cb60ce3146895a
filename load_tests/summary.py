"""Turn per-request results and the monitor's findings into a verdict and the numbers a report shows.

Pure functions over :class:`~load_tests.client.RequestResult` lists and an
:class:`~load_tests.monitor.InvariantChecker`; no I/O. The result is a
:class:`~load_tests.results.RunSummary` (``summary.json``).

The verdict fails a run on any of:

* an invariant violation (negative / decreasing counter, sum mismatch at
  quiescence, unexpected accounting violations);
* a lost request: a stream that ended without ``[DONE]`` and without an
  error (``truncated``), a ``timeout``, or a request the generator started
  but has no result for;
* an unexpected error: 5xx, a stream error event, a transport error, a 4xx
  for a good request, a 200 for a bad one, or a 4xx that does not name the
  field it should. A failed request that was in flight when the run itself
  killed a replica, or started within ``KILL_GRACE_S`` after the kill, is
  *explained* and reported apart: with direct streaming a killed replica
  cuts its streams (the client sees ``truncated`` or a transport error, no
  error event), and until Serve notices the death new requests can still
  be routed to it. An explained request is never counted as ``ok``;
* client/server disagreement: the engines finished fewer requests than the
  clients saw complete, or more than were sent to them;
* a replica that died without the run killing it (seen in the scraped data
  in every mode; with a local deployment also through Ray's state API);
* a planned fault that did not fire, or whose handling does not show
  (:mod:`load_tests.fault_evidence`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .client import RequestResult
from .monitor import InvariantChecker
from .outcomes import FAILURE_OUTCOMES, LOST_OUTCOMES
from .replica_metrics import ReplicaCounters
from .results import (BadRequestProblem, BadRequests, ClientServer, Fault, Invariants, Latency, Percentiles,
                      ReplicaRecord, RunSummary, Throughput)
from .scenarios import Slo

if TYPE_CHECKING:
    from .fault_evidence import FaultCheck

__all__ = ["Fault", "Slo", "percentiles", "summarize", "server_cross_check", "unexpected_deaths",
           "explained_by_fault", "bad_request_problems", "error_signature"]

PERCENTILES = (50, 90, 95, 99)
# After a kill, how long new requests may still fail because of it (Serve takes a few seconds to see a
# replica die and stop routing to it).
KILL_GRACE_S = 30.0


def percentiles(values: Sequence[float], points: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"p50": ..., ..., "mean": ...}`` of ``values`` (None each when there are none): every latency figure
    of the load tests and the benchmarks."""
    if not len(values):
        return {f"p{p}": None for p in points} | {"mean": None}
    arr = np.asarray(values, dtype=float)
    return {f"p{p}": float(np.percentile(arr, p)) for p in points} | {"mean": float(arr.mean())}


def explained_by_fault(r: RequestResult, faults: list[Fault], grace_s: float = KILL_GRACE_S) -> bool:
    """A failed request that was in flight at a replica kill, or started within ``grace_s`` after it."""
    end = r.start + (r.e2e or 0.0)
    return any(f.kind == "replica_kill" and r.start <= f.t + grace_s and end >= f.t for f in faults)


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
                       replicas_died: bool, baseline: dict[str, ReplicaCounters] | None = None) -> ClientServer:
    """Compare what the clients saw complete with what the engines counted as finished.

    Each request that reaches an engine finishes there exactly once (stop,
    length, abort, error, repetition). So, summed over every replica ever
    seen: completed-by-engine >= completed-by-client, and every finished
    request was one the clients sent. A cancelled stream may still have
    finished in the engine before the abort arrived, hence the range. The
    engines' counts are taken relative to ``baseline`` (the scrape before the
    run), so earlier traffic on a long-lived deployment does not count.
    """
    baseline = baseline or {}

    def delta(key: str, rc: ReplicaCounters, reasons: tuple[str, ...] | None) -> float:
        before = baseline.get(key)
        return sum(v - (before.requests_finished.get(reason, 0.0) if before else 0.0)
                   for reason, v in rc.requests_finished.items() if reasons is None or reason in reasons)

    ok = sum(r.outcome == "ok" for r in results)
    cancelled = sum(r.outcome == "cancelled" for r in results)
    sent_to_engines = sum(r.outcome not in ("rejected",) for r in results)
    completed = sum(delta(k, rc, ("stop", "length", "repetition")) for k, rc in final.items())
    finished = sum(delta(k, rc, None) for k, rc in final.items())
    out = ClientServer(client_ok=ok, client_cancelled=cancelled, engine_completed=completed,
                       engine_finished=finished, sent_past_router=sent_to_engines)
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
    """Replicas that died (seen in the data, or missing from Ray's replica list) without the run killing them."""
    killed = {f.detail.get("replica") for f in faults if f.kind == "replica_kill"}
    return sorted((set(checker.deaths) | set(listed_dead)) - killed)


def summarize(results: list[RequestResult], started: int, checker: InvariantChecker, faults: list[Fault],
              wall_s: float, slo: Slo, deaths: list[str], fault_checks: list[FaultCheck] = ()) -> RunSummary:
    """``deaths``: replicas that died without the run killing them (:func:`unexpected_deaths`)."""
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
    baseline = checker.baseline()
    cross = server_cross_check(results, final, replicas_died=bool(checker.deaths or any(
        f.kind == "replica_kill" for f in faults) or deaths), baseline=baseline)
    bad = bad_request_problems(results)
    out_tokens = sum(r.completion_tokens or r.chunks for r in ok)

    def rate(n: float) -> float:
        return n / wall_s if wall_s else 0.0

    summary = RunSummary(
        wall_s=wall_s,
        started=started,
        outcomes=dict(outcomes),
        throughput=Throughput(requests_per_s=rate(len(ok)), output_tokens_per_s=rate(out_tokens),
                              goodput_requests_per_s=rate(sum(slo.met(r) for r in results))),
        slo=slo,
        latency_s=Latency(ttft=Percentiles(**percentiles([r.ttft for r in ok if r.ttft is not None])),
                          itl=Percentiles(**percentiles([x for r in ok for x in r.itl])),
                          tpot=Percentiles(**percentiles([r.tpot for r in ok if r.tpot is not None])),
                          e2e=Percentiles(**percentiles([r.e2e for r in ok if r.e2e is not None]))),
        errors_by_kind=dict(Counter(r.outcome for r in unexplained)),
        errors_by_message=dict(Counter(error_signature(r) for r in unexplained).most_common(5)),
        errors_explained_by_faults=dict(Counter(r.outcome for r in explained)),
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
            scrape_seconds=Percentiles(**percentiles([h.scrape_s for h in checker.history[1:-1]])),
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
    reasons = summary.failures
    if not checker.ok:
        first = {}
        for v in checker.violations:
            first.setdefault(v.kind, v)
        reasons.append(f"{len(checker.violations)} invariant violation(s): {summary.invariants.by_kind}; "
                       + "; ".join(f"first {k} at t = {v.t:.0f} s: {v.message}" for k, v in first.items()))
    lost_n = lost + sum(r.outcome in LOST_OUTCOMES for r in unexplained)
    if lost_n:
        reasons.append(f"{lost_n} lost request(s) (truncated / timed out / never finished, not explained by a "
                       f"planned fault)")
    if unexplained:
        common = Counter(error_signature(r) for r in unexplained).most_common(3)
        reasons.append(f"{len(unexplained)} unexpected error(s): {summary.errors_by_kind}; most common: "
                       + "; ".join(f"({n}x) {sig}" for sig, n in common))
    if bad:
        reasons.append(f"{len(bad)} bad request(s) refused without naming the field")
    reasons.extend(cross.problems)
    if deaths:
        when = {k: checker.deaths.get(k) for k in deaths}
        reasons.append("replica(s) died without the run killing them: " + ", ".join(
            f"{k}" + (f" (seen dead from t = {t:.0f} s)" if t is not None else " (gone from Ray's replica list)")
            for k, t in when.items()))
    for c in fault_checks:
        if not c.fired:
            reasons.append(f"planned fault {c.fault} did not fire: {c.evidence}")
        reasons.extend(f"planned fault {c.fault}: {p}" for p in c.problems)
    if not ok:
        reasons.append("no request completed")
    return summary
