"""Did every fault a run planned actually fire? Evidence from the scraped counters, per fault.

A chaos run that passes because its faults never fired proves nothing, so
the verdict fails unless each planned fault shows in the data:

``load_failures``, ``load_delays``, ``lying_connector``
    the ``kv_faults`` patch counts every fault it injects in
    ``vllm:kv_fault_injections_total{kind}`` (``load_failure``,
    ``load_delay``, ``lie_*``), per replica: the sum over replicas must grow
    during the run. With the accounting patch on, each live replica that
    had them must also show it *handled* them: an ``after_load_failure``
    correction where loads failed, a violation of a lying-connector kind
    where the connector told an impossible count (negative or beyond the
    prompt; a "changing" lie is a possible count and needs no clamp).
``preemption_storm``
    ``vllm:num_preemptions_total`` grew.
``replica_kill``
    the run killed a replica, the data shows that replica dead, and a
    replica first seen alive after the kill finished requests (the
    replacement serves).
``redeploy``, ``scale``, ``autoscale``, ``node_loss``
    each step of the scenario's operations (:mod:`load_tests.operate.steps`)
    was carried out and converged within its timeout; every replica that
    left was retired by Serve or lost with the killed node (never a death
    with failed health checks); replicas that came up after the step
    finished requests; a redeploy's probes were refused (400 naming the key)
    before it and accepted after it converged; a node loss took at least
    one replica with it; and Serve force-killed no draining replica.

Everything is counted from the scrape before the load, so earlier traffic on
the deployment does not count.
"""

from __future__ import annotations

from collections.abc import Sequence

from patches.definitions.metrics import IMPOSSIBLE_LIES, LIE_KINDS

from ..observe.counters import ReplicaCounters
from ..observe.monitor import InvariantChecker
from ..operate.steps import STEP_TYPES
from ..results.events import Event, OperationFailed, ReplicaKilled, StepEvent
from ..results.models import FaultCheck
from .departures import planned_departures

PLANNED_FAULTS = ("load_failures", "load_delays", "lying_connector", "preemption_storm", "replica_kill", *STEP_TYPES)


def _delta(now: dict[str, float], before: dict[str, float] | None, keys) -> float:
    before = before or {}
    return sum(now.get(k, 0.0) - before.get(k, 0.0) for k in keys)


def _grown(
    final: dict[str, ReplicaCounters], baseline: dict[str, ReplicaCounters], attr: str, keys
) -> dict[str, float]:
    """Per replica, how much ``attr[key]`` (summed over ``keys``) grew during the run; only replicas where it did."""
    out = {}
    for key, rc in final.items():
        before = getattr(baseline[key], attr) if key in baseline else None
        d = _delta(getattr(rc, attr), before, keys)
        if d > 0:
            out[key] = d
    return out


def check_planned_faults(
    planned: Sequence[str],
    checker: InvariantChecker,
    events: Sequence[Event],
    accounting_on: bool,
    forced_kills: Sequence[str] = (),
    listed_dead: Sequence[str] = (),
) -> list[FaultCheck]:
    """One :class:`FaultCheck` per planned fault (``events``: what the run did itself, e.g. replica kills and
    operations; ``forced_kills``: Serve's log lines for replicas it force-killed; ``listed_dead``: replicas Ray
    listed during the run and not after it)."""
    unknown = set(planned) - set(PLANNED_FAULTS)
    if unknown:
        raise ValueError(f"unknown planned fault(s) {sorted(unknown)}; known: {PLANNED_FAULTS}")
    final, baseline = checker.final(), checker.baseline()
    live = {k for k in final if k not in checker.stale}
    checks = []
    for fault in planned:
        if fault in ("load_failures", "load_delays"):
            kind = "load_failure" if fault == "load_failures" else "load_delay"
            checks.append(_injected(fault, kind, (kind,), final, baseline))
            if fault == "load_failures" and accounting_on:
                _handled(
                    checks[-1],
                    final,
                    baseline,
                    live,
                    "corrections",
                    ("after_load_failure",),
                    "failed loads injected but no after_load_failure correction",
                )
        elif fault == "lying_connector":
            check = _injected(fault, "lie_*", LIE_KINDS, final, baseline)
            checks.append(check)
            if accounting_on:
                _every_lie_clamped(check, final, baseline, live)
        elif fault == "preemption_storm":
            grown = {}
            for key, rc in final.items():
                d = rc.preemptions - (baseline[key].preemptions if key in baseline else 0.0)
                if d > 0:
                    grown[key] = d
            total = sum(grown.values())
            checks.append(
                FaultCheck(
                    fault, total > 0, f"num_preemptions grew by {total:g}: {grown or 'nowhere'}", per_replica=grown
                )
            )
        elif fault == "replica_kill":
            checks.append(_replica_kill(checker, events, final, baseline))
        else:
            checks.append(_operation(fault, checker, events, final, baseline, forced_kills, listed_dead))
    if not accounting_on:
        for c in checks:
            if c.fault in ("load_failures", "lying_connector"):
                c.evidence += " (accounting patch off: how it was handled is not checked)"
    if checker.deaths:
        for c in checks:
            if not c.fired and c.fault != "replica_kill":
                c.evidence += (
                    f" ({len(checker.deaths)} replica(s) died during the run: a replica that dies in "
                    f"the step that injects a fault never exports its count)"
                )
    return checks


def _injected(fault: str, label: str, kinds: tuple[str, ...], final, baseline) -> FaultCheck:
    grown = _grown(final, baseline, "injections", kinds)
    total = sum(grown.values())
    return FaultCheck(
        fault,
        total > 0,
        f"kv_fault_injections{{{label}}} grew by {total:g}: {grown or 'nowhere'}",
        per_replica={k: {"injected": v} for k, v in grown.items()},
    )


def _handled(
    check: FaultCheck,
    injected_on: dict[str, ReplicaCounters],
    baseline,
    live: set[str],
    attr: str,
    kinds: tuple[str, ...],
    problem: str,
) -> None:
    handled = _grown(injected_on, baseline, attr, kinds)
    for key in injected_on:
        check.per_replica.setdefault(key, {})[attr] = handled.get(key, 0.0)
        if key not in live:
            check.per_replica[key]["note"] = "dead: its last export may lag, not checked"
        elif key not in handled:
            check.problems.append(f"replica {key}: {problem}")


def _every_lie_clamped(check: FaultCheck, final, baseline, live: set[str]) -> None:
    """Each impossible lie is one violation of its kind (the accounting patch checks every report the
    scheduler gets, and both counts leave EngineCore in the same SchedulerStats), so on a live replica the
    violations of a kind are at least the lies of that kind."""
    for lie, kind in IMPOSSIBLE_LIES.items():
        told = _grown(final, baseline, "injections", (lie,))
        clamped = _grown(final, baseline, "violations", (kind,))
        for key, n in told.items():
            check.per_replica.setdefault(key, {})[kind] = clamped.get(key, 0.0)
            if key not in live:
                check.per_replica[key]["note"] = "dead: its last export may lag, not checked"
            elif clamped.get(key, 0.0) < n:
                check.problems.append(
                    f"replica {key}: the connector told {n:g} x {lie} but only "
                    f"{clamped.get(key, 0.0):g} x {kind} were clamped"
                )


def _replica_kill(checker: InvariantChecker, events: Sequence[Event], final, baseline) -> FaultCheck:
    kills = [f for f in events if isinstance(f, ReplicaKilled)]
    if not kills:
        return FaultCheck("replica_kill", False, "the run killed no replica")
    problems, evidence = [], []
    for kill in kills:
        rid = kill.replica
        if rid in checker.deaths:
            evidence.append(f"replica {rid} killed at {kill.t:.0f} s, seen dead from {checker.deaths[rid]:.0f} s")
        else:
            problems.append(f"replica {rid} was killed at {kill.t:.0f} s but its metrics never showed it dead")
    first_kill = min(k.t for k in kills)
    replacements = {}
    for key, t in checker.first_alive.items():
        if t <= first_kill or key not in final:
            continue
        before = baseline[key].requests_total if key in baseline else 0.0
        if final[key].requests_total - before > 0:
            replacements[key] = {"first_alive_t": t, "requests_finished": final[key].requests_total - before}
    if replacements:
        evidence.append(f"replacement(s) serving: {replacements}")
    else:
        problems.append("no replica that came up after the kill finished a request (no replacement served)")
    return FaultCheck("replica_kill", True, "; ".join(evidence) or "no evidence", problems, replacements)


def _operation(
    kind: str, checker: InvariantChecker, events: Sequence[Event], final, baseline, forced_kills, listed_dead
) -> FaultCheck:
    """Every step of ``kind``: carried out and converged, the replicas it brought up served, its own evidence (its
    step class's :meth:`~load_tests.operate.steps.Step.judge`); no replica died unplanned, none force-killed."""
    steps: list[StepEvent] = [
        f for f in events if f.kind == kind and not isinstance(f, (ReplicaKilled, OperationFailed))
    ]
    failed = [f.error for f in events if isinstance(f, OperationFailed) and f.step == kind]
    if not steps:
        return FaultCheck(kind, False, f"the run carried out no {kind}" + (f": {kind}: {failed[0]}" if failed else ""))
    judge = STEP_TYPES[kind]
    departures = planned_departures(checker, events, listed_dead)
    problems: list[str] = [f"a {kind} step could not be carried out (the plan stopped there): {e}" for e in failed]
    evidence: list[str] = []
    for f in steps:
        what = f"{kind} at t = {f.t:.0f} s ({f.by})"
        if not f.converged:
            problems.append(
                f"{what} did not converge: {f.why or 'the load ended first'}" + (f"; Ray: {f.ray}" if f.ray else "")
            )
            continue
        evidence.append(
            f"{what}: {len(f.replicas_before)} -> {len(f.replicas_after)} replicas serving, "
            f"converged in {f.converge_s:.0f} s"
        )
        came_up = set(f.replicas_after) - set(f.replicas_before)
        fresh = {
            k: final[k].requests_total - (baseline[k].requests_total if k in baseline else 0.0)
            for k in came_up
            if k in final
        }
        if any(v <= 0 for v in fresh.values()) or len(fresh) < len(came_up):
            problems.append(f"{what}: a replica that came up for it finished no request: {fresh}")
        judge(f.step).judge(f, what, problems, evidence)
    unplanned = sorted(k for k in checker.deaths if k not in departures)
    if departures:
        evidence.append(f"left as planned: {len(departures)} replica(s)")
    if unplanned:
        problems.append(f"replica(s) died with failed health checks during the operations: {unplanned}")
    if forced_kills:
        problems.append(
            f"Serve force-killed {len(forced_kills)} draining replica(s) (requests cut at the graceful "
            f"shutdown timeout): {forced_kills[0]}"
        )
    return FaultCheck(kind, True, "; ".join(evidence) or "no evidence", problems, {"departures": departures})
