"""The counter-invariant monitor: every replica's counters, scraped during a run and checked.

:class:`InvariantChecker` is pure: feed it snapshots (one scrape of every
endpoint: ``{replica: ReplicaCounters}``, the endpoints that failed, the
replicas the caller knows are dead) and it records every violation with its
full context. The rules themselves live in :mod:`load_tests.observe.invariants`;
this module decides when each applies. :class:`Monitor` scrapes every
node's metrics endpoint on a fixed interval and feeds the checker.

What fails a run, per kind of violation:

``negative``, ``decrease``
    at every scrape, per series (a series is one replica's counter: Ray's
    ``ReplicaId`` labels it, and a restarted replica has a new id, so a
    restart is a new series, never a decrease);
``sum_mismatch``, ``cached_exceeds_total``, ``not_quiescent``
    at quiescence, on the replicas still alive;
``accounting_violation``
    the patch's ``vllm:prompt_token_accounting_violations_total`` grew for a
    kind the run does not inject (runs with a lying connector expect some:
    those kinds are tallied in ``expected_violations``, not failures);
``duplicate_replica``
    one replica reported by two endpoints (two series mixed up);
``scrape_failed``
    an endpoint unreadable for :data:`SCRAPE_FAILURE_BOUND` consecutive
    scrapes (a single failed scrape is recorded in ``scrape_errors`` only:
    under full load Ray's metrics agent can miss a 30 s timeout once), unless
    the run declared it lost (:meth:`InvariantChecker.lose_endpoint`: the
    run killed that node): then its failures are recorded, its replicas are
    dead from the loss, and quiescence no longer waits for it.

Deaths are read from the same data, so they are checked against any
deployment, ``--url`` included: a replica seen alive during the run (its
vLLM gauges exported, Serve not saying unhealthy; ``ReplicaCounters.alive``)
that is then seen dead in :data:`DEATH_BOUND` consecutive scrapes of its
endpoint is dead from the first of them (``deaths``). Ray keeps a dead
replica's counters with their last values (ray issue #65892): a dead
replica, and one never seen alive during the run (dead before it started),
is *stale*: kept for the report, left out of the quiescence checks (it died
mid-flight). Whether a death was planned is the verdict's question
(:mod:`load_tests.judge.summary`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from serve_app.observability.contract import CHECKS

from . import invariants
from .counters import ReplicaCounters
from .invariants import Finding
from .scraper import merge_pages

# Under full load on 2 cores Ray's metrics agent can take many seconds to answer.
SCRAPE_TIMEOUT_S = 30.0
# Ray's processes export their metrics to the node's agent every metrics_report_interval_ms (10 s unless the
# cluster sets RAY_metrics_report_interval_ms). Work that starts and ends between two exports is invisible
# until the next one, gauges included, so two idle scrapes can agree on values that predate it. Two
# identical idle scrapes more than one export apart cannot: the later one follows an export.
RAY_METRICS_EXPORT_INTERVAL_S = 10.0
SETTLE_INTERVAL_S = RAY_METRICS_EXPORT_INTERVAL_S + 1.0
# Consecutive failed scrapes of one endpoint that fail a run.
SCRAPE_FAILURE_BOUND = 2
# Consecutive scrapes a replica must be seen dead in before it counts as dead (one missed export is not a death;
# Ray itself keeps a gauge for two export intervals for the same reason): the observability contract's parameter
# of the twin of FuzzserveReplicaDied.
DEATH_BOUND: int = CHECKS["deaths"].params["death_bound_scrapes"]
# The finding of a violation kind the run does not inject (the twin of FuzzserveAccountingViolation).
ACCOUNTING_VIOLATION = CHECKS["accounting_violation"].kind


@dataclass
class Violation:
    kind: str
    replica: str
    counter: str
    message: str
    t: float
    context: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, finding: Finding, t: float) -> Violation:
        return cls(finding.kind, finding.replica, finding.counter, finding.message, t, finding.context)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Snapshot:
    t: float
    replicas: dict[str, ReplicaCounters]
    dead: frozenset[str] = frozenset()  # replicas the caller knows died by then (a pid gone, a kill it made)
    scrape_s: float = 0.0  # how long the scrape took (a starved metrics agent shows here)
    errors: dict[str, str] = field(default_factory=dict)  # endpoint -> why it could not be read
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # replica -> endpoints that all reported it


class InvariantChecker:
    def __init__(self, expected_violation_kinds: Iterable[str] = ()):
        self.expected_violation_kinds = set(expected_violation_kinds)
        self.violations: list[Violation] = []
        self.last: dict[str, tuple[float, ReplicaCounters]] = {}
        self.first_seen: dict[str, float] = {}
        self.first_alive: dict[str, float] = {}
        self.deaths: dict[str, float] = {}  # replica -> time of the first scrape that saw it dead
        self.stale: set[str] = set()
        self.history: list[Snapshot] = []
        self.expected_violations: dict[str, float] = {}
        self.scrape_errors: list[dict[str, Any]] = []
        self._failing: dict[str, tuple[float, int]] = {}  # endpoint -> (first failure t, consecutive failures)
        self._dead_since: dict[str, tuple[float, int]] = {}  # replica -> (first dead-looking t, consecutive)
        self.lost_endpoints: dict[str, float] = {}  # endpoint -> when the run lost its node on purpose

    @property
    def ok(self) -> bool:
        return not self.violations

    def _flag(self, finding: Finding, t: float) -> None:
        self.violations.append(Violation.of(finding, t))

    def observe(self, snap: Snapshot) -> None:
        """Check one scrape against the previous scrape of each replica."""
        self.history.append(snap)
        self._endpoints(snap)
        for key, urls in snap.duplicates.items():
            self._flag(
                Finding(
                    "duplicate_replica",
                    key,
                    "",
                    f"replica {key} reported by {len(urls)} endpoints: "
                    f"{', '.join(urls)} (kept the first; two series are being mixed up)",
                    {"endpoints": urls},
                ),
                snap.t,
            )
        self._liveness(snap)
        for key, rc in snap.replicas.items():
            self.first_seen.setdefault(key, snap.t)
            for f in invariants.negative(rc):
                self._flag(f, snap.t)
            prev = self.last.get(key)
            if prev is not None:
                for f in invariants.decreases(prev[1], rc):
                    f.context["previous_t"] = prev[0]
                    self._flag(f, snap.t)
            self._check_accounting(key, prev[1] if prev else None, rc, snap.t)
            self.last[key] = (snap.t, rc)

    def lose_endpoint(self, url: str, t: float) -> list[str]:
        """The run killed the node behind ``url`` at ``t``: from then on its scrape failures are planned (recorded,
        not violations), the replicas it reported are dead from ``t`` (stale: their last values are kept, never
        compared again), and quiescence does not wait for it. The replicas it took down."""
        self.lost_endpoints[url] = t
        gone = self.replicas_on(url)
        for key in gone:
            self.deaths.setdefault(key, t)
        self.stale |= set(gone)
        return gone

    def replicas_on(self, url: str) -> list[str]:
        """The replicas last reported by endpoint ``url`` (one node's)."""
        return sorted(k for k, (_t, rc) in self.last.items() if rc.node == url)

    def lost(self, url: str, t: float) -> bool:
        return url in self.lost_endpoints and t >= self.lost_endpoints[url]

    def _endpoints(self, snap: Snapshot) -> None:
        for url, err in snap.errors.items():
            self.scrape_errors.append({"t": snap.t, "url": url, "error": err, "planned": self.lost(url, snap.t)})
            if self.lost(url, snap.t):
                continue
            since, n = self._failing.get(url, (snap.t, 0))
            self._failing[url] = (since, n + 1)
            if n + 1 == SCRAPE_FAILURE_BOUND:
                self._flag(
                    Finding(
                        "scrape_failed",
                        "",
                        url,
                        f"metrics endpoint {url} unreadable in {SCRAPE_FAILURE_BOUND} consecutive scrapes "
                        f"from t = {since:.0f} s: {err}",
                        {"since": since, "error": err},
                    ),
                    snap.t,
                )
        for url in [u for u in self._failing if u not in snap.errors]:
            del self._failing[url]

    def _liveness(self, snap: Snapshot) -> None:
        looks_dead = set()
        for key, rc in snap.replicas.items():
            if rc.alive:
                self.first_alive.setdefault(key, snap.t)
            else:
                looks_dead.add(key)
        # seen before, absent now although its endpoint was read: its series are gone
        looks_dead |= {
            key
            for key, (_t, rc) in self.last.items()
            if key not in snap.replicas and rc.node not in snap.errors and rc.node not in self.lost_endpoints
        }
        for key in list(self._dead_since):
            if key not in looks_dead:
                del self._dead_since[key]
        for key in looks_dead & set(self.first_alive):
            since, n = self._dead_since.get(key, (snap.t, 0))
            self._dead_since[key] = (since, n + 1)
            if n + 1 >= DEATH_BOUND:
                self.deaths.setdefault(key, since)
        never_alive = {key for key in snap.replicas if key not in self.first_alive}
        self.stale |= set(snap.dead) | set(self.deaths) | never_alive
        self.stale -= {key for key in self.first_alive if key not in self.deaths and key not in snap.dead}

    def live(self) -> set[str]:
        """The replicas alive at the last scrape (seen alive, not dead since; the operations' convergence test)."""
        return set(self.live_in(self.history[-1])) if self.history else set()

    def live_in(self, snap: Snapshot) -> dict[str, ReplicaCounters]:
        """The replicas alive in scrape ``snap`` and not dead by now, with their counters."""
        return {
            key: rc for key, rc in snap.replicas.items() if rc.alive and key not in self.deaths and key not in snap.dead
        }

    def _check_accounting(self, key: str, before: ReplicaCounters | None, now: ReplicaCounters, t: float) -> None:
        for kind, grew in invariants.violations_grown(before, now).items():
            if kind in self.expected_violation_kinds:
                self.expected_violations[kind] = self.expected_violations.get(kind, 0.0) + grew
            else:
                self._flag(
                    Finding(
                        ACCOUNTING_VIOLATION,
                        key,
                        f"violations{{{kind}}}",
                        f"the accounting patch clamped {grew:g} x {kind} on replica {key}",
                        {"node": now.node, "violations": now.violations, "corrections": now.corrections},
                    ),
                    t,
                )

    def check_quiescent(self, snap: Snapshot) -> None:
        """The end-of-run checks, on a scrape taken with no request in flight."""
        self.observe(snap)
        for key, rc in snap.replicas.items():
            if key in self.stale:
                continue
            for f in invariants.busy(rc) + invariants.quiescence(rc):
                self._flag(f, snap.t)

    def final(self) -> dict[str, ReplicaCounters]:
        """The last values of every replica ever seen (stale ones included)."""
        return {k: rc for k, (_t, rc) in self.last.items()}

    def baseline(self) -> dict[str, ReplicaCounters]:
        """The scrape before the load: counting from it leaves out earlier traffic (a replica new since counts from
        0)."""
        return self.history[0].replicas if self.history else {}


class Monitor:
    """Scrape ``urls`` every ``interval`` seconds in the background and feed an :class:`InvariantChecker`.

    ``dead`` (optional) returns the ReplicaIds the caller knows have died
    (a local deployment: a pid gone, a kill the run made), so their series are
    recognised as stale before the data shows it. It must be cheap: it runs
    at every scrape, when the machine is at its busiest (Ray's state API can
    take a minute to answer then; a process-table lookup by pid does not).
    """

    def __init__(
        self,
        urls: list[str],
        checker: InvariantChecker,
        interval: float = 2.0,
        dead: Callable[[], frozenset[str]] | None = None,
        settle_interval: float = SETTLE_INTERVAL_S,
        t0: float | None = None,
        record: Callable[[float, list], None] | None = None,
    ):
        self.urls, self.checker, self.interval = urls, checker, interval
        self.record = record  # gets (t, [(url, text or error)]) of every scrape (load_tests.observe.record)
        self.settle_interval = settle_interval
        self.dead = dead or frozenset
        self._task: asyncio.Task | None = None
        self._t0 = time.monotonic() if t0 is None else t0  # snapshot times are seconds since this

    async def scrape_once(self, client: httpx.AsyncClient) -> Snapshot:
        started = time.monotonic()

        async def page(url: str) -> tuple[str, str | BaseException]:
            try:
                r = await client.get(url)
                r.raise_for_status()
                return url, r.text
            except httpx.HTTPError as e:
                return url, e

        pages = await asyncio.gather(*(page(u) for u in self.urls))
        result = await asyncio.to_thread(merge_pages, pages)
        if self.record is not None:
            await asyncio.to_thread(self.record, started - self._t0, pages)
        return Snapshot(
            started - self._t0,
            result.replicas,
            self.dead(),
            time.monotonic() - started,
            result.errors,
            result.duplicates,
        )

    async def _loop(self) -> None:
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            while True:
                started = time.monotonic()
                self.checker.observe(await self.scrape_once(client))
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def baseline(self) -> Snapshot:
        """One scrape before the load starts: the counters' starting point."""
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            snap = await self.scrape_once(client)
        self.checker.observe(snap)
        return snap

    def start(self, t0: float | None = None) -> None:
        if t0 is not None:
            self._t0 = t0
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def quiescent_check(self, settle_s: float = 90.0) -> Snapshot:
        """Wait until no live replica has work and the counters stop moving, then run the final checks.

        "Stopped moving" means two identical idle scrapes ``settle_interval``
        apart; that interval must exceed the deployment's metrics export
        interval (:data:`SETTLE_INTERVAL_S`), else a short burst that ended
        between two exports passes as quiescence on the values from before
        it. After ``settle_s`` the checks run anyway (and ``not_quiescent``
        says why).
        Every scrape on the way is checked like any other.
        """
        deadline = time.monotonic() + settle_s
        last = None
        async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S) as client:
            while True:
                snap = await self.scrape_once(client)
                gone = self.checker.stale | snap.dead
                errors = {u for u in snap.errors if not self.checker.lost(u, snap.t)}
                idle = not errors and all(
                    r.running == 0 and r.waiting == 0 for k, r in snap.replicas.items() if k not in gone
                )
                values = {k: r.counters() for k, r in snap.replicas.items()}
                if (idle and values == last) or time.monotonic() > deadline:
                    break
                self.checker.observe(snap)
                last = values if idle else None
                await asyncio.sleep(self.settle_interval)
        self.checker.check_quiescent(snap)
        return snap
