"""The counter-invariant monitor: every replica's counters, scraped during a run and checked.

:class:`InvariantChecker` is pure: feed it snapshots (time, ``{replica:
ReplicaCounters}``, the replicas known dead) and it records every
violation with its full context. :class:`Monitor` scrapes Ray's metrics
endpoints of every node on a fixed interval and feeds the checker.

Checks, per series (a series is one replica's counter: Ray's ``ReplicaId``
labels it, and a restarted replica has a new id, so a restart is a new
series, never a decrease):

``negative``
    a counter below 0 (or not finite) at any scrape;
``decrease``
    a counter lower than at the previous scrape *of the same replica*;
``sum_mismatch`` (at quiescence, live replicas)
    ``local_compute + local_cache_hit + external_kv_transfer != prompt_tokens``;
``cached_exceeds_total`` (at quiescence)
    ``prompt_tokens_cached > prompt_tokens``;
``accounting_violation``
    the patch's ``vllm:prompt_token_accounting_violations_total`` grew. Runs
    that inject a lying connector expect some: those kinds are listed in
    ``expected_violation_kinds`` and reported apart, not as failures.

A dead replica's series stays in Ray's export with its last values (Ray
issue #65892): once a replica is known dead it is *stale*; its last values
are kept for the report and it is left out of the quiescence checks (it died
mid-flight, its counters never reached quiescence).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from .replica_metrics import ReplicaCounters, replica_counters

# Under full load on 2 cores Ray's metrics agent can take many seconds to answer.
SCRAPE_TIMEOUT_S = 30.0


@dataclass
class Violation:
    kind: str
    replica: str
    counter: str
    message: str
    t: float
    context: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Snapshot:
    t: float
    replicas: dict[str, ReplicaCounters]
    dead: frozenset[str] = frozenset()  # replicas known to have died by then
    scrape_s: float = 0.0  # how long the scrape took (a starved metrics agent shows here)


class InvariantChecker:
    def __init__(self, expected_violation_kinds: Iterable[str] = ()):
        self.expected_violation_kinds = set(expected_violation_kinds)
        self.violations: list[Violation] = []
        self.last: dict[str, tuple[float, ReplicaCounters]] = {}
        self.first_seen: dict[str, float] = {}
        self.stale: set[str] = set()
        self.history: list[Snapshot] = []
        self.expected_violations: dict[str, float] = {}

    @property
    def ok(self) -> bool:
        return not self.violations

    def _flag(self, kind: str, replica: str, counter: str, message: str, t: float, **context: Any) -> None:
        self.violations.append(Violation(kind, replica, counter, message, t, context))

    def observe(self, snap: Snapshot) -> None:
        """Check one scrape against the previous scrape of each replica."""
        self.history.append(snap)
        self.stale |= snap.dead
        for key, rc in snap.replicas.items():
            self.first_seen.setdefault(key, snap.t)
            now = rc.counters()
            for name, v in now.items():
                if v < 0 or not math.isfinite(v):
                    self._flag("negative", key, name, f"{name} = {v} on replica {key}", snap.t, node=rc.node,
                               counters=now)
            prev = self.last.get(key)
            if prev is not None:
                t_prev, before = prev
                old = before.counters()
                for name, v in now.items():
                    was = old.get(name, 0.0)
                    if v < was:
                        self._flag("decrease", key, name, f"{name} went backwards on replica {key}: {was:g} -> {v:g}",
                                   snap.t, node=rc.node, previous_t=t_prev, previous=old, current=now)
                for name, was in old.items():
                    if name not in now and was > 0:
                        self._flag("decrease", key, name, f"{name} disappeared from replica {key} (was {was:g})",
                                   snap.t, node=rc.node, previous=old, current=now)
                self._check_accounting(key, before, rc, snap.t)
            elif sum(rc.violations.values()) > 0:
                self._check_accounting(key, ReplicaCounters(key), rc, snap.t)
            self.last[key] = (snap.t, rc)

    def _check_accounting(self, key: str, before: ReplicaCounters, now: ReplicaCounters, t: float) -> None:
        for kind, v in now.violations.items():
            grew = v - before.violations.get(kind, 0.0)
            if grew <= 0:
                continue
            if kind in self.expected_violation_kinds:
                self.expected_violations[kind] = self.expected_violations.get(kind, 0.0) + grew
            else:
                self._flag("accounting_violation", key, f"violations{{{kind}}}",
                           f"the accounting patch clamped {grew:g} x {kind} on replica {key}", t,
                           node=now.node, violations=now.violations, corrections=now.corrections)

    def check_quiescent(self, snap: Snapshot) -> None:
        """The end-of-run checks, on a scrape taken with no request in flight."""
        self.observe(snap)
        for key, rc in snap.replicas.items():
            if key in self.stale:
                continue
            if rc.running or rc.waiting:
                self._flag("not_quiescent", key, "num_requests_running",
                           f"replica {key} still has {rc.running:g} running / {rc.waiting:g} waiting requests",
                           snap.t, counters=rc.counters())
            parts = {s: rc.by_source.get(s, 0.0) for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
            if sum(parts.values()) != rc.prompt_tokens:
                self._flag("sum_mismatch", key, "prompt_tokens",
                           f"replica {key}: local_compute + local_cache_hit + external_kv_transfer = "
                           f"{sum(parts.values()):g} != prompt_tokens = {rc.prompt_tokens:g}", snap.t,
                           node=rc.node, by_source=parts, prompt_tokens=rc.prompt_tokens)
            if rc.prompt_tokens_cached > rc.prompt_tokens:
                self._flag("cached_exceeds_total", key, "prompt_tokens_cached",
                           f"replica {key}: prompt_tokens_cached = {rc.prompt_tokens_cached:g} > "
                           f"prompt_tokens = {rc.prompt_tokens:g}", snap.t, node=rc.node)

    def final(self) -> dict[str, ReplicaCounters]:
        """The last values of every replica ever seen (stale ones included)."""
        return {k: rc for k, (_t, rc) in self.last.items()}


class Monitor:
    """Scrape ``urls`` every ``interval`` seconds in the background and feed an :class:`InvariantChecker`.

    ``dead`` (optional) returns the ReplicaIds known to have died, so their
    series are recognised as stale. It must be cheap: it runs at every scrape,
    when the machine is at its busiest (Ray's state API can take a minute to
    answer then; a process-table lookup by pid does not). A scrape that fails is
    recorded (a node whose metrics cannot be read is itself a finding), not
    fatal.
    """

    def __init__(self, urls: list[str], checker: InvariantChecker, interval: float = 2.0,
                 dead: Callable[[], frozenset[str]] | None = None):
        self.urls, self.checker, self.interval = urls, checker, interval
        self.dead = dead or frozenset
        self.scrape_errors: list[dict[str, Any]] = []
        self._task: asyncio.Task | None = None
        self._t0 = time.monotonic()

    async def scrape_once(self, client: httpx.AsyncClient) -> dict[str, ReplicaCounters]:
        merged: dict[str, ReplicaCounters] = {}
        for url in self.urls:
            try:
                r = await client.get(url)
                r.raise_for_status()
            except httpx.HTTPError as e:
                self.scrape_errors.append({"t": time.monotonic() - self._t0, "url": url, "error": repr(e)[:300]})
                continue
            merged.update(await asyncio.to_thread(replica_counters, r.text, url))
        return merged

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            while True:
                started = time.monotonic()
                replicas = await self.scrape_once(client)
                self.checker.observe(Snapshot(started - self._t0, replicas, self.dead(),
                                              time.monotonic() - started))
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def baseline(self) -> Snapshot:
        """One scrape before the load starts: the counters' starting point."""
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            replicas = await self.scrape_once(client)
        snap = Snapshot(time.monotonic() - self._t0, replicas, self.dead())
        self.checker.observe(snap)
        return snap

    def start(self, t0: float | None = None) -> None:
        self._t0 = t0 if t0 is not None else time.monotonic()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def quiescent_check(self, settle_s: float = 90.0, export_period_s: float = 6.0) -> Snapshot:
        """Wait until no live replica has work and the counters stop moving, then run the final checks.

        Ray's metrics agent exports every few seconds, so "stopped moving"
        means two identical idle scrapes ``export_period_s`` apart. After
        ``settle_s`` the checks run anyway (and ``not_quiescent`` says why).
        """
        deadline = time.monotonic() + settle_s
        last = None
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            while True:
                replicas = await self.scrape_once(client)
                dead = self.dead()
                snap = Snapshot(time.monotonic() - self._t0, replicas, dead)
                live = [r for k, r in replicas.items() if k not in dead]
                idle = all(r.running == 0 and r.waiting == 0 for r in live)
                values = {k: r.counters() for k, r in replicas.items()}
                if idle and values == last or time.monotonic() > deadline:
                    break
                last = values if idle else None
                await asyncio.sleep(export_period_s)
        self.checker.check_quiescent(snap)
        return snap
