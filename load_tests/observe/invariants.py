"""The counter invariants, written once: every checker (the load-test monitor, the per-replica
counters CLI, the engine and server tests) calls these functions.

Each rule takes one replica's counters (:class:`~load_tests.observe.counters.ReplicaCounters`)
and returns :class:`Finding` s, empty when the rule holds. What a finding *means* for a run
(a violation, or something a planned fault explains) is the caller's business; the rules
only say what is wrong.

``negative``
    a counter below 0, or not finite, at any scrape.
``decrease``
    a counter lower than at the previous scrape of the same replica, or a
    labelled counter that was > 0 and disappeared (Ray labels every series with
    the replica's id, and a restarted replica gets a new id, so a restart is
    a new series, never a decrease).
``sum_mismatch`` (at quiescence)
    ``local_compute + local_cache_hit + external_kv_transfer != prompt_tokens``.
``cached_exceeds_total`` (at quiescence)
    ``prompt_tokens_cached > prompt_tokens``.
``not_quiescent``
    a replica still has running or waiting requests when it should be idle.

Which rules apply depends on what is known of the replica: over a run the
monitor decides (:mod:`load_tests.observe.monitor`); for one replica seen once,
:func:`one_scrape` does (never negative; the sums only at rest, alive and idle).

Each rule is the Python twin of an alert of the observability contract
(:data:`serve_app.observability.contract.INVARIANTS`, which the shipped Prometheus rules are written from): its
finding's kind and its parameters are the catalogue's
(:data:`~serve_app.observability.contract.CHECKS`), and tests/test_observability_contract.py holds the two to the
same verdict.

Accounting violations (``vllm:prompt_token_accounting_violations_total{kind}``
growing) are not a rule of the counters: whether growth is a failure depends on
the faults a run injects, so :func:`violations_grown` only measures it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from serve_app.observability.contract import CHECKS

from .counters import ReplicaCounters

NEGATIVE, DECREASE, SUM_MISMATCH, CACHED_EXCEEDS_TOTAL = (
    CHECKS[kind] for kind in ("negative", "decrease", "sum_mismatch", "cached_exceeds_total")
)


@dataclass
class Finding:
    kind: str
    replica: str
    counter: str
    message: str
    context: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def negative(rc: ReplicaCounters) -> list[Finding]:
    now = rc.counters()
    return [
        Finding(
            NEGATIVE.kind, rc.replica, name, f"{name} = {v} on replica {rc.replica}", {"node": rc.node, "counters": now}
        )
        for name, v in now.items()
        if v < 0 or not math.isfinite(v)
    ]


def decreases(before: ReplicaCounters, now: ReplicaCounters) -> list[Finding]:
    old, new = before.counters(), now.counters()
    out = [
        Finding(
            DECREASE.kind,
            now.replica,
            name,
            f"{name} went backwards on replica {now.replica}: {old[name]:g} -> {v:g}",
            {"node": now.node, "previous": old, "current": new},
        )
        for name, v in new.items()
        if name in old and v < old[name]
    ]
    out += [
        Finding(
            DECREASE.kind,
            now.replica,
            name,
            f"{name} disappeared from replica {now.replica} (was {was:g})",
            {"node": now.node, "previous": old, "current": new},
        )
        for name, was in old.items()
        if name not in new and was > 0
    ]
    return out


def quiescence(rc: ReplicaCounters) -> list[Finding]:
    """The identities that hold once a replica has no request in flight."""
    out = []
    parts = {s: rc.by_source.get(s, 0.0) for s in SUM_MISMATCH.params["sources"]}
    if sum(parts.values()) != rc.prompt_tokens:
        out.append(
            Finding(
                SUM_MISMATCH.kind,
                rc.replica,
                "prompt_tokens",
                f"replica {rc.replica}: local_compute + local_cache_hit + external_kv_transfer = "
                f"{sum(parts.values()):g} != prompt_tokens = {rc.prompt_tokens:g}",
                {"node": rc.node, "by_source": parts, "prompt_tokens": rc.prompt_tokens},
            )
        )
    if rc.prompt_tokens_cached > rc.prompt_tokens:
        out.append(
            Finding(
                CACHED_EXCEEDS_TOTAL.kind,
                rc.replica,
                "prompt_tokens_cached",
                f"replica {rc.replica}: prompt_tokens_cached = {rc.prompt_tokens_cached:g} > "
                f"prompt_tokens = {rc.prompt_tokens:g}",
                {"node": rc.node},
            )
        )
    return out


def busy(rc: ReplicaCounters) -> list[Finding]:
    if not (rc.running or rc.waiting):
        return []
    return [
        Finding(
            "not_quiescent",
            rc.replica,
            "num_requests_running",
            f"replica {rc.replica} still has {rc.running:g} running / {rc.waiting:g} waiting requests",
            {"counters": rc.counters()},
        )
    ]


def at_rest(rc: ReplicaCounters) -> list[Finding]:
    """Every rule for a replica that should be idle: not negative, idle, parts summing to the total."""
    return negative(rc) + busy(rc) + quiescence(rc)


def violations_grown(before: ReplicaCounters | None, now: ReplicaCounters) -> dict[str, float]:
    """How much each accounting-violation kind grew between two scrapes of one replica (only the kinds that grew)."""
    was = before.violations if before is not None else {}
    return {kind: v - was.get(kind, 0.0) for kind, v in now.violations.items() if v - was.get(kind, 0.0) > 0}


def one_scrape(rc: ReplicaCounters) -> tuple[Literal["dead", "busy", "at rest"], list[Finding]]:
    """What one scrape of one replica can tell, and the rules that hold for it.

    Never negative, for every replica. The sums only at rest (alive and
    idle): a dead replica's last export died mid-flight (Ray keeps it), and a
    busy one has requests in flight.
    """
    if not rc.alive:
        return "dead", negative(rc)
    if busy(rc):
        return "busy", negative(rc)
    return "at rest", at_rest(rc)
