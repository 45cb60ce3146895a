"""Routing affinity across replica changes: a fuzz setting + prompt prefix lands on the replica the router names.

The fuzz-aware router (:mod:`serve_app.routing.fuzz_router`) sends every request of one
(fuzz cache salt, prompt prefix) key to the replica that rendezvous hashing
picks among the *live* replicas, unless that replica is busier than the
least-loaded one by more than the router's imbalance threshold. A scale step
changes the live set, so it is where affinity can break: a router left with
a stale replica list, two ingress routers that disagree, a new replica
never chosen.

Under 256 streams the load-balancing escape hatch is taken all the time,
so affinity is checked with the load paused (as ``tests/test_serve_app.py``
does on a standing deployment): after a step converged, the load stops
starting requests, the replicas go idle (two identical idle scrapes more
than a metrics export apart), then for each live replica one key whose home
it is is sent a distinct number of times (the replica at sorted position
``j`` gets ``j + 1`` requests, so a permutation of homes shows), one request
after another; once idle again, each replica's ``requests_total`` must have
grown by exactly its key's count, and the load resumes.

The expected home is computed with the router's own key and hash functions
over Serve's full replica ids, so what is checked is the deployment (HAProxy,
the ingress request routers, their replica lists), not a copy of the policy.
"""

from __future__ import annotations

import types
from dataclasses import asdict, dataclass
from typing import Any

from fixture_model.tasks import LETTERS, NUMBERS
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, replica_full_id
from serve_app.routing.keys import affinity_key, rendezvous, request_text

from ..observe.invariants import busy
from ..observe.monitor import InvariantChecker, Snapshot
from ..results.events import AffinityKeyRecord, AffinityRecord

# A prompt prefix longer than any router's prefix_chars default (512): every request of a key shares its key.
PREFIX = " ".join((LETTERS + NUMBERS)[i % 30] for i in range(300))
MAX_TOKENS = 4


def candidate_settings(n: int = 64) -> list[dict[str, Any] | None]:
    """Fuzz settings with distinct cache salts (unfuzzed first): the keys the check picks from."""
    return [
        None,
        {"fuzz_strength": 0.5},
        *({"fuzz_strength": 2.0, "fuzz_mode": "gaussian", "fuzz_seed": s} for s in range(n)),
    ]


@dataclass(frozen=True)
class AffinityKey:
    xargs: dict[str, Any] | None  # the fuzz setting (vllm_xargs); None: unfuzzed
    home: str  # the ReplicaId the router's hash names for it
    count: int  # how many requests it is sent

    def body(self, model: str, i: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "prompt": f"{PREFIX} {i}", "max_tokens": MAX_TOKENS, "temperature": 0}
        if self.xargs is not None:
            body["vllm_xargs"] = self.xargs
        return body


def home_replica(xargs: dict[str, Any] | None, live: list[str], model: str, prefix_chars: int) -> str:
    """The ReplicaId (of ``live``) that the fuzz-aware router prefers for :data:`PREFIX` under ``xargs``."""
    full = {replica_full_id(r, ENGINE_DEPLOYMENT_PREFIX + model): r for r in live}
    text = request_text(types.SimpleNamespace(prompt=PREFIX), prefix_chars)  # as the router reads a request
    assert text is not None
    return full[rendezvous(affinity_key(text, xargs), sorted(full))]


def affinity_keys(live: list[str], model: str, prefix_chars: int) -> list[AffinityKey]:
    """One key homed on each live replica; the replica at sorted position j is sent j + 1 requests."""
    order = sorted(live)
    found: dict[str, dict[str, Any] | None] = {}
    for xargs in candidate_settings():
        found.setdefault(home_replica(xargs, order, model, prefix_chars), xargs)
        if len(found) == len(order):
            break
    else:  # 66 keys over a handful of replicas: missing one means the hash is broken
        raise ValueError(
            f"no key homed on {sorted(set(order) - set(found))} among {len(candidate_settings())} settings"
        )
    return [AffinityKey(found[r], r, j + 1) for j, r in enumerate(order)]


def idle_counts(checker: InvariantChecker, since: float, settle_s: float) -> dict[str, float] | None:
    """Each live replica's ``requests_total`` once the deployment is idle: the last scrape taken after ``since``
    and a scrape at least ``settle_s`` (more than a metrics export) before it, both idle and error-free, agree.
    None while that is not so."""
    snaps = [s for s in checker.history if s.t >= since]
    if not snaps:
        return None

    def idle(s: Snapshot) -> dict[str, float] | None:
        live = checker.live_in(s)
        if s.errors or not live or any(busy(rc) for rc in live.values()):
            return None
        return {k: rc.requests_total for k, rc in live.items()}

    last = idle(snaps[-1])
    if last is None:
        return None
    for s in snaps[:-1]:
        if snaps[-1].t - s.t >= settle_s and idle(s) == last:
            return last
    return None


@dataclass
class AffinityCheck:
    """What one check saw: the keys sent, each replica's requests between the two idle points, the verdict."""

    t: float
    keys: list[AffinityKey]
    before: dict[str, float]
    after: dict[str, float] | None = None
    statuses: list[int | None] | None = None  # of every request sent, in order
    paused_s: float = 0.0
    why: str | None = None  # set when it could not be carried out

    @property
    def served(self) -> dict[str, float]:
        after = self.after or {}
        return {k: after[k] - self.before.get(k, 0.0) for k in after}

    def problems(self) -> list[str]:
        if self.why:
            return [self.why]
        out = []
        bad = [s for s in self.statuses or [] if s != 200]
        if bad:
            out.append(f"{len(bad)} of {len(self.statuses or [])} affinity request(s) failed: {bad[:5]}")
        if self.after is None:
            return [*out, "the replicas did not go idle after the affinity requests"]
        if set(self.after) != set(self.before):
            out.append(f"the live replicas changed during the check: {sorted(self.before)} -> {sorted(self.after)}")
        want = {k.home: float(k.count) for k in self.keys}
        got = {k: v for k, v in self.served.items() if v}
        if got != want:
            out.append(
                f"requests per replica {got}, the router's hash names {want} (each key's home gets its "
                f"count: keys {[(k.xargs, k.home) for k in self.keys]})"
            )
        return out

    def record(self) -> AffinityRecord:
        return AffinityRecord(
            t=round(self.t, 1),
            keys=[AffinityKeyRecord(**asdict(k)) for k in self.keys],
            before=self.before,
            after=self.after,
            served=self.served,
            statuses=self.statuses,
            paused_s=round(self.paused_s, 1),
            problems=self.problems(),
        )
