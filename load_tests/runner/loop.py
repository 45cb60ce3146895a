"""The load loop: :func:`run_load` drives a scenario's load at a :class:`~load_tests.operate.target.LoadTarget`,
watches every replica's counters while it runs, and waits for quiescence.

How it runs is a typed :class:`RunConfig` (the CLI builds one from its
flags, ``testkit.monitoring.e2e`` builds one directly); what it drives is the
:class:`~load_tests.plan.scenarios.Scenario` (profile, mix, planned replica kill,
probes, operations). What it hands back, :class:`LoadRun`, is every request's result,
what the run did on purpose (its events) and what the monitor saw; turning that into
figures and a verdict is :mod:`load_tests.judge`'s job (:func:`load_tests.runner.run.run`
does the whole).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from pydantic import BaseModel, ConfigDict, Field
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import SetupError
from ..load.client import INGRESS_RETRY_DELAYS_S, RequestResult, send
from ..load.client_cost import ClientCostSample, LoopLag, ProcessCpu
from ..load.drive import LoadLevel, drive, drive_levels
from ..load.hostile import HostileConnection, attack
from ..observe.monitor import SETTLE_INTERVAL_S, InvariantChecker, Monitor
from ..observe.record import MetricsRecorder
from ..operate.operator import Operator
from ..operate.replica_ports import replica_http_ports
from ..operate.target import LoadTarget
from ..plan.hostile import CONNECTION_KINDS, REPLICA_KINDS
from ..plan.probes import probe_specs
from ..plan.scenarios import Scenario
from ..plan.workload import Mix, RequestSpec, draw
from ..results.events import Event

log = logging.getLogger("fuzzserve.load_tests")


class RunConfig(BaseModel):
    """How a load run runs (the scenario says what it sends)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="the request mix's draws and the choice of the replica to kill")
    request_timeout_s: float = Field(300.0, gt=0, description="per request")
    progress: bool = Field(True, description="a live progress bar on the terminal")
    scrape_interval_s: float = Field(2.0, gt=0, description="between the monitor's scrapes during the load")
    settle_interval_s: float = Field(
        SETTLE_INTERVAL_S,
        gt=0,
        description="between the idle scrapes that must agree at quiescence; must exceed "
        "the cluster's metrics export interval (Ray: 10 s by default)",
    )
    settle_timeout_s: float = Field(
        90.0, ge=0, description="the final checks run anyway after this long (not_quiescent)"
    )
    probe_every_s: float = Field(60.0, gt=0, description="between probe rounds under the load (scenarios with probes)")
    declare_lost_nodes: bool = Field(
        True,
        description="a node loss is declared to the monitor (off: the failing "
        "twin, whose lost endpoint must fail the run)",
    )
    ingress_retry: bool = Field(
        True,
        description="send a request HAProxy refused before any replica saw it again, "
        "as the openai SDK does (off: the refusal is the request's "
        "outcome, as curl, vLLM's bench serve or GuideLLM see it)",
    )
    record_metrics: Path | None = Field(
        None,
        description="JSON-lines file for what the nodes exported of the "
        "rules' families, every 10 s (load_tests.observe.record)",
    )


@dataclass
class LoadRun:
    """What :func:`run_load` hands back: every request's result and what the monitor saw."""

    results: list[RequestResult]
    started: int  # requests started, probes included (each ends as a result, or is lost)
    checker: InvariantChecker
    monitor: Monitor
    events: list[Event]  # what the run did on purpose (replica kills, operation steps)
    wall_s: float  # the load's window: first request started to last answer (the figures' denominator)
    operator_ok: int = 0  # complete answers to the operations' own requests (probes, affinity checks)
    windows: list[tuple[str, float, float]] = field(default_factory=list)  # the hostile scenario's (kind, start, end)
    connections: list[HostileConnection] = field(default_factory=list)  # its hostile connections
    cost: ClientCostSample | None = None  # the client's own CPU and loop lag over the load's window


# What starts the requests: called with the loop, ``one(index)`` (sends the index-th request of the mix and records
# it) and the stop event; returns how many it started. The default follows the scenario's profile
# (load_tests.load.drive.drive); the capacity search steps through loads (load_tests.runner.sweep.SweepDriver).
Driver = Callable[["LoadLoop", Callable[[int], Awaitable[None]], asyncio.Event], Awaitable[int]]


async def run_load(
    target: LoadTarget, scenario: Scenario, config: RunConfig, t0: float, driver: Driver | None = None
) -> LoadRun:
    """Drive the load, watch it, wait for quiescence; SIGINT stops starting new requests."""
    return await LoadLoop(target, scenario, config, t0).run(driver)


async def _profile_driver(loop: LoadLoop, one: Callable[[int], Awaitable[None]], stop: asyncio.Event) -> int:
    return await drive(loop.sc.profile, one, seed=loop.config.seed, stop=stop)


class LoadLoop:
    """One run's state: the results as they come, the progress bar, the probe rounds and the kill beside the load."""

    def __init__(self, target: LoadTarget, scenario: Scenario, config: RunConfig, t0: float):
        self.target, self.sc, self.config, self.t0 = target, scenario, config, t0
        self.checker = InvariantChecker(scenario.expected_violation_kinds)
        record = MetricsRecorder(config.record_metrics) if config.record_metrics is not None else None
        self.monitor = Monitor(
            target.metrics_urls,
            self.checker,
            interval=config.scrape_interval_s,
            dead=target.dead,
            settle_interval=config.settle_interval_s,
            t0=t0,
            record=record,
        )
        self.results: list[RequestResult] = []
        self.events: list[Event] = []
        self.counts: dict[str, int] = {}
        self.probes_started = 0
        self.stop = asyncio.Event()  # ends the load early: SIGINT, or the scenario's operations done
        self.gate = asyncio.Event()  # cleared while an operation pauses the load (an affinity check)
        self.gate.set()
        self.operations_task: asyncio.Task | None = None
        self.operator: Operator | None = None  # when the scenario has operations
        self.level: LoadLevel | None = None  # when the operations change the load (autoscaling)
        self.probe_rounds: list[asyncio.Future] = []
        self.mix: Mix = scenario.mix  # what the next request is drawn from (hostile windows add the hostile share)
        self.windows: list[tuple[str, float, float]] = []
        self.connections: list[HostileConnection] = []
        self.hostile_task: asyncio.Task | None = None
        self.load_started = asyncio.Event()  # the hostile windows start with the load, not with the side tasks
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f} {task.fields[unit]}"),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            disable=not config.progress,
        )
        sweep = scenario.profile.kind == "sweep"  # its steps end it, not a count or a duration
        self.task = self.progress.add_task(
            scenario.name,
            total=None if sweep else scenario.profile.max_requests or scenario.profile.duration_s,
            unit="requests" if sweep or scenario.profile.max_requests else "s",
            status="",
        )

    async def one(self, session: aiohttp.ClientSession, spec: RequestSpec) -> None:
        await self.gate.wait()  # paused: the request is sent on resuming (its timings start then)
        res = await send(
            session,
            self.target.base_url,
            spec,
            self.t0,
            timeout_s=self.config.request_timeout_s,
            ingress_retry_delays_s=INGRESS_RETRY_DELAYS_S if self.config.ingress_retry else (),
            headers=self.target.headers,
        )
        self.results.append(res)
        self.counts[res.outcome] = self.counts.get(res.outcome, 0) + 1
        done = len(self.results) if self.sc.profile.max_requests else time.monotonic() - self.t0
        self.progress.update(
            self.task, completed=done, status=" ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        )

    async def prober(self, session: aiohttp.ClientSession) -> None:
        """The probe set every ``probe_every_s`` while the load runs (each probe counts as a started request; a
        round is never cancelled half-way, so no probe goes missing)."""
        rnd = 0
        while True:
            await asyncio.sleep(self.config.probe_every_s)
            specs = probe_specs(rnd, self.sc.mix)
            self.probes_started += len(specs)
            self.probe_rounds.append(asyncio.ensure_future(asyncio.gather(*(self.one(session, s) for s in specs))))
            await asyncio.shield(self.probe_rounds[-1])
            rnd += 1

    async def operate(self, session: aiohttp.ClientSession) -> None:
        """The scenario's operations, one after another; the load stops after the last one (load_tests.operate)."""
        assert self.sc.operations is not None
        self.operator = Operator(
            self.sc.operations,
            self.target,
            self.checker,
            self.t0,
            self.stop,
            self.events,
            self.sc.mix.model,
            declare_lost=self.config.declare_lost_nodes,
            level=self.level,
            gate=self.gate,
            settle_s=self.config.settle_interval_s,
            ingress_retry=self.config.ingress_retry,
        )
        await self.operator.run(session)

    def levels_driver(self) -> Driver:
        """The load at the level the scenario's autoscale steps set (load_tests.load.drive.drive_levels)."""
        level = self.level = LoadLevel(self.sc.profile.concurrency)
        return lambda _loop, one, stop: drive_levels(level, one, stop)

    async def killer(self, victims: dict[str, int]) -> None:
        assert self.sc.kill_replica_at_s is not None
        await asyncio.sleep(self.sc.kill_replica_at_s)
        event = await asyncio.to_thread(self.target.kill_one, victims, self.config.seed, self.t0)
        if event is not None:
            self.events.append(event)

    async def hostile(self, replica_urls: list[str]) -> None:
        """The hostile scenario's windows (load_tests.plan.hostile): calm and hostile in ABBA order; a hostile
        window draws its requests with the hostile share and opens the hostile connections at its start, at the
        ingress and, for the replica kinds, at the engine replicas' own ports (``replica_urls``, in turn). Runs to
        its end (the last stalled reader included): its windows are the load's own."""
        plan = self.sc.hostile
        assert plan is not None
        await self.load_started.wait()
        attacks: list[asyncio.Task] = []
        for k in range(plan.windows):
            start = time.monotonic() - self.t0
            kind = "hostile" if plan.hostile_window(k) else "calm"
            self.mix = (
                self.sc.mix.model_copy(update={"hostile": plan.share, "hostile_requests": plan.requests})
                if kind == "hostile"
                else self.sc.mix
            )
            if kind == "hostile":
                attacks += [
                    asyncio.create_task(
                        attack(
                            c,
                            replica_urls[i % len(replica_urls)] if c in REPLICA_KINDS else self.target.base_url,
                            self.t0,
                            plan.close_bound_s[c] + 15,
                            self.target.api_key,
                            self.sc.mix.model,
                        )
                    )
                    for c in CONNECTION_KINDS
                    for i in range(plan.connections)
                ]
            with contextlib.suppress(TimeoutError):  # SIGINT (the stop event) ends the window and the scenario early
                await asyncio.wait_for(self.stop.wait(), plan.window_s)
            self.windows.append((kind, start, time.monotonic() - self.t0))
            if self.stop.is_set():
                break
        self.mix = self.sc.mix
        self.connections = list(await asyncio.gather(*attacks))

    def side_tasks(self, session: aiohttp.ClientSession, listed: dict[str, int] | None) -> list[asyncio.Task]:
        """What runs beside the load: the planned replica kill, the probe rounds."""
        side = []
        if self.sc.kill_replica_at_s is not None:
            if not listed:
                raise SetupError("--kill-replica-at needs a local deployment (no --url) whose replicas can be listed")
            side.append(asyncio.create_task(self.killer(listed)))
        if self.sc.probes:
            side.append(asyncio.create_task(self.prober(session)))
        if self.sc.operations:
            self.operations_task = asyncio.create_task(self.operate(session))
            side.append(self.operations_task)
        if self.sc.hostile:
            ports = replica_http_ports(listed.values()) if listed else []
            if self.sc.hostile.connections and not ports:
                raise SetupError(
                    "the hostile scenario attacks the engine replicas' own ports too: it needs a local deployment "
                    "(no --url) whose replicas can be listed"
                )
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            self.hostile_task = asyncio.create_task(self.hostile(urls))
            side.append(self.hostile_task)
        return side

    async def run(self, driver: Driver | None = None) -> LoadRun:
        stop = self.stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
                if driver is None and self.sc.operations and self.sc.operations.changes_load:
                    driver = self.levels_driver()  # before the operator starts: it changes the level
                side = self.side_tasks(session, await asyncio.to_thread(self.target.list_replicas))
                await self.monitor.baseline()
                self.monitor.start()
                load_start = time.monotonic()  # the load's window: not the replica listing or the baseline scrape
                cpu, lag = ProcessCpu(), LoopLag()
                cpu.start()
                lag.start()
                self.load_started.set()
                with self.progress:
                    started = await (driver or _profile_driver)(
                        self, lambda i: self.one(session, draw(self.mix, self.config.seed, i)), stop
                    )
                for s in side:
                    if s is self.hostile_task:
                        continue  # its windows are the load's: it ends with it, and its connections are awaited
                    if s is not self.operations_task or not (self.operator and self.operator.finished):
                        s.cancel()  # the operations end the load themselves: they finish (Ray's last answers)
                await asyncio.gather(*side, return_exceptions=True)
                await asyncio.gather(*self.probe_rounds)  # a probe round in flight finishes: its requests count
                wall = time.monotonic() - load_start
                cost = ClientCostSample(cpu.stop(), list(lag.lags), cpu.runqueue_wait_s)
                await lag.stop()
                await self.monitor.stop()
                log.info("load finished: %d requests in %.0f s; waiting for quiescence", started, wall)
                await self.monitor.quiescent_check(self.config.settle_timeout_s)
                await asyncio.to_thread(self.target.note_final_listing)
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        return LoadRun(
            self.results,
            started + self.probes_started,
            self.checker,
            self.monitor,
            self.events,
            wall,
            windows=self.windows,
            connections=self.connections,
            cost=cost,
            operator_ok=self.operator.completed if self.operator else 0,
        )
