"""Which replicas left as planned (killed by the run, lost with a node it killed, retired by Serve after an
operation) and which died: the unplanned deaths fail the run."""

from __future__ import annotations

from collections.abc import Sequence

from ..observe.monitor import InvariantChecker
from ..results.events import RETIRING, Event, NodeLost, ReplicaKilled


def planned_departures(
    checker: InvariantChecker, events: Sequence[Event], listed_dead: Sequence[str] = ()
) -> dict[str, str]:
    """Replicas that left because of an operation the run made, and why (the rest of the deaths are unplanned).

    * lost with a node the run killed (the node's replicas, from the monitor);
    * retired: gone after a redeploy, scale or autoscaling step began, with no failed health check (Serve stopped a
      healthy replica; a crash, a hang or a lost node fails its health checks first).
    """
    out: dict[str, str] = {}
    for f in events:
        if isinstance(f, NodeLost):
            for key in f.replicas:
                out[key] = f"lost with node {f.node} at t = {f.t:.0f} s"
    starts = [f.t for f in events if f.kind in RETIRING]
    if not starts:
        return out
    final, baseline = checker.final(), checker.baseline()
    for key in (set(checker.deaths) | set(listed_dead)) - set(out):
        died = checker.deaths.get(key)
        if died is not None and died < min(starts):
            continue
        failed = (
            final[key].health_check_failures - (baseline[key].health_check_failures if key in baseline else 0.0)
            if key in final
            else 0.0
        )
        if failed <= 0:
            op = max(
                (f for f in events if f.kind in RETIRING and (died is None or f.t <= died)),
                key=lambda f: f.t,
                default=None,
            )
            out[key] = (
                f"retired by Serve after the {op.kind if op else 'operation'}"
                + (f" at t = {op.t:.0f} s" if op else "")
                + " (no failed health check)"
            )
    return out


def unexpected_deaths(checker: InvariantChecker, events: Sequence[Event], listed_dead: Sequence[str] = ()) -> list[str]:
    """Replicas that died (seen in the data, or missing from Ray's replica list) without the run killing them,
    losing their node, or an operation retiring them (:func:`planned_departures`)."""
    killed = {f.replica for f in events if isinstance(f, ReplicaKilled)}
    planned = set(planned_departures(checker, events, listed_dead))
    return sorted((set(checker.deaths) | set(listed_dead)) - killed - planned)
