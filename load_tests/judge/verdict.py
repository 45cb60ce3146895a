"""Whether a run passed: the reasons its :class:`~load_tests.results.models.RunSummary` fails it, one line each.

A pure function of the summary's figures (:mod:`load_tests.judge.summary`) and the
monitor's violations; the only place that says why a run fails. A run fails on any of:

* an invariant violation (negative / decreasing counter, sum mismatch at
  quiescence, unexpected accounting violations);
* a lost request: a stream that ended without ``[DONE]`` and without an
  error (``truncated``), a ``timeout``, or a request the generator started
  but has no result for (failures a planned replica kill explains are
  counted apart, never here);
* an unexpected error: 5xx, a stream error event, a transport error, a 4xx
  for a good request, a 200 for a bad one, or a 4xx that does not name the
  field it should;
* a refusal at the ingress (:mod:`load_tests.load.client` retries those)
  outside every window around a change the run made to the replica set, or
  more of them than the changes' budget (:mod:`load_tests.judge.ingress`):
  with the replica set standing still HAProxy's router list and backends do
  not change, so such a refusal says the ingress is broken, whether or not a
  retry got an answer (one still refused after the retries, or any refusal
  with ``--no-ingress-retry``, is a 5xx above anyway);
* client/server disagreement: the engines finished fewer requests than the
  clients saw complete, or more than were sent to them;
* a replica that died without the run killing it, losing its node, or an
  operation retiring it (seen in the scraped data in every mode; with a local
  deployment also through Ray's state API:
  :func:`load_tests.judge.departures.unexpected_deaths`);
* a planned fault that did not fire, or whose handling does not show
  (:mod:`load_tests.judge.evidence`);
* a greedy probe answered under faults unlike the fault-free deployment, or
  a fault-free reference that was not stable (:mod:`load_tests.judge.probes`);
* in the hostile scenario, a hostile request not refused naming its field or
  header, a hostile connection the server did not close within its bound, or
  the normal clients' goodput under attack below the bound
  (:mod:`load_tests.judge.hostile`);
* no request completed at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..load.outcomes import LOST_OUTCOMES
from ..observe.monitor import Violation
from ..results.models import RunSummary
from .ingress import ingress_problems


def verdict(summary: RunSummary, violations: Sequence[Violation]) -> list[str]:
    """Why ``summary``'s run failed, in the order above (empty: it passed)."""
    reasons = []
    if violations:
        first: dict[str, Violation] = {}
        for v in violations:
            first.setdefault(v.kind, v)
        reasons.append(
            f"{len(violations)} invariant violation(s): {summary.invariants.by_kind}; "
            + "; ".join(f"first {k} at t = {v.t:.0f} s: {v.message}" for k, v in first.items())
        )
    errors = summary.errors_by_kind
    lost = summary.outcomes.get("lost", 0) + sum(n for o, n in errors.items() if o in LOST_OUTCOMES)
    if lost:
        reasons.append(
            f"{lost} lost request(s) (truncated / timed out / never finished, not explained by a planned fault)"
        )
    if errors:
        common = list(summary.errors_by_message.items())[:3]
        reasons.append(
            f"{sum(errors.values())} unexpected error(s): {errors}; most common: "
            + "; ".join(f"({n}x) {sig}" for sig, n in common)
        )
    reasons.extend(ingress_problems(summary.ingress_retries))
    bad = summary.outcomes.get("rejected", 0) - summary.bad_requests.rejected_naming_the_field
    if bad:
        reasons.append(f"{bad} bad request(s) refused without naming the field")
    reasons.extend(summary.client_server.problems)
    if summary.unexpected_replica_deaths:
        when = {
            k: summary.replicas[k].died_at if k in summary.replicas else None for k in summary.unexpected_replica_deaths
        }
        reasons.append(
            "replica(s) died without the run killing them: "
            + ", ".join(
                f"{k}" + (f" (seen dead from t = {t:.0f} s)" if t is not None else " (gone from Ray's replica list)")
                for k, t in when.items()
            )
        )
    for c in summary.planned_faults:
        if not c.fired:
            reasons.append(f"planned fault {c.fault} did not fire: {c.evidence}")
        reasons.extend(f"planned fault {c.fault}: {p}" for p in c.problems)
    if summary.probes is not None:
        reasons.extend(f"probes: {p}" for p in summary.probes.problems)
    if summary.hostile is not None:
        reasons.extend(f"hostile: {p}" for p in summary.hostile.problems)
    if not summary.outcomes.get("ok"):
        reasons.append("no request completed")
    return reasons
