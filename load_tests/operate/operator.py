"""Operations under load: the :class:`Operator` runs a plan's steps one after another beside the load.

A scenario with ``operations`` (:class:`~load_tests.plan.steps.OperationPlan`)
runs its steps in order: each waits ``after_s`` (after the load started, or
after the previous step converged), is carried out, and is then watched
until it *converged*: the replicas serving are the ones the step asked for.
How each kind is carried out and when it has converged is its class's
(:mod:`load_tests.operate.steps`). The load runs on for ``tail_s`` after the
last step and then stops (the profile's duration is only a cap).

Replicas that Serve stops during a redeploy or a scale-down are *retired*,
not dead: their health gauge drops to 0 without a failed health check
(``ray_serve_health_check_failures_total``), which a crash, a hang or a lost
node always shows (:func:`load_tests.judge.departures.planned_departures`).

Each step is recorded as an event (:mod:`load_tests.results.events`: what
was done, when it converged, the replicas before and after, the probes); a
step that cannot be carried out (:class:`~load_tests.errors.StepError`, or
``serve deploy`` refusing the config) is an ``operation_failed`` event and
ends the plan. The verdict requires every step's evidence
(:mod:`load_tests.judge.evidence`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import psutil

from serve_app.config import deploy_config
from serve_app.config.names import replica_id
from serve_app.routing.keys import DEFAULT_PREFIX_CHARS

from ..errors import LoadTestError
from ..load.client import INGRESS_RETRY_DELAYS_S, post_past_ingress_refusals
from ..load.drive import LoadLevel
from ..observe.engine_cores import engine_cores_view
from ..observe.monitor import InvariantChecker
from ..plan.steps import OperationPlan
from ..results.events import Event, GuardProbe, OperationFailed, Redeployed, Scaled, StepEvent
from .affinity import AffinityCheck, affinity_keys, idle_counts
from .local_cluster import QUERY_ERRORS
from .steps import Deployment, Step, step_of
from .target import LoadTarget

log = logging.getLogger("fuzzserve.load_tests")


# What the operator's own HTTP requests (probes, affinity requests) can raise: the connection or the response failed
# (aiohttp.ClientError) or the client's timeout expired (TimeoutError, asyncio's included). Recorded as a request
# without an answer; anything else is a bug and propagates.
HTTP_ERRORS: tuple[type[Exception], ...] = (aiohttp.ClientError, TimeoutError)
# What carrying out a step can raise: the step's own refusal (StepError, a LoadTestError), a cluster command that
# failed (serve deploy refusing the config included: QUERY_ERRORS), a process it signals already gone (psutil.Error).
STEP_ERRORS: tuple[type[Exception], ...] = (LoadTestError, *QUERY_ERRORS, psutil.Error)
# What reading the cluster's view (replicas, their cores, nodes, Serve's status) can raise.
VIEW_ERRORS: tuple[type[Exception], ...] = (*QUERY_ERRORS, psutil.Error)
# What the affinity check can raise: its cluster queries and its requests.
AFFINITY_ERRORS: tuple[type[Exception], ...] = (*QUERY_ERRORS, *HTTP_ERRORS)


class Operator:
    """Carries out an :class:`OperationPlan` beside the load (local cluster), or tells the operator to (``--url``)."""

    def __init__(
        self,
        plan: OperationPlan,
        target: LoadTarget,
        checker: InvariantChecker,
        t0: float,
        stop: asyncio.Event,
        events: list[Event],
        model: str,
        declare_lost: bool = True,
        level: LoadLevel | None = None,
        gate: asyncio.Event | None = None,
        settle_s: float = 11.0,
        ingress_retry: bool = True,
    ):
        self.plan, self.target, self.checker, self.t0, self.stop = plan, target, checker, t0, stop
        self.model = model
        self.gate = gate  # set while the load may start requests (cleared for an affinity check)
        self.settle_s = settle_s  # two idle scrapes this far apart mean idle (the monitor's settle interval)
        self.retry_delays_s = INGRESS_RETRY_DELAYS_S if ingress_retry else ()  # as the load's requests
        self.events = events  # the run's list: a step is recorded when it starts, completed when it converges
        self.probes: list[GuardProbe] = []
        self.completed = 0  # this operator's requests answered 200 (the engines count them too)
        self.views: list[asyncio.Task] = []  # Ray's view after each step (look), gathered at the end
        self.finished = False
        cluster = target.cluster
        self.deployment = Deployment(cluster, checker, level, getattr(cluster, "deployed_config", None), declare_lost)

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self, session: aiohttp.ClientSession) -> None:
        prober = asyncio.create_task(self.prober(session)) if self.plan.probe_key else None
        try:
            for planned in self.plan.steps:
                await asyncio.sleep(planned.after_s)
                step = step_of(planned)
                before = sorted(self.checker.live())
                t = self.now()
                try:
                    event = await step.perform(self.deployment, t, before)
                except STEP_ERRORS as e:  # a StepError, or `serve deploy` refused the config: the step never happened
                    log.error("t = %.0f s: %s could not be carried out: %s", self.now(), planned.kind, e)
                    self.events.append(
                        OperationFailed(t=self.now(), step=planned.kind, error=f"{type(e).__name__}: {e}"[:500])
                    )
                    break
                log.info("t = %.0f s: %s (%s); serving before: %s", t, planned.kind, event.by, before)
                self.events.append(event)
                if not await self.converge(step, event):
                    break
                if self.plan.affinity_check and step.checks_affinity:
                    await self.check_affinity(session, event)
            await asyncio.sleep(self.plan.tail_s)
        finally:
            if prober is not None:
                prober.cancel()
                await asyncio.gather(prober, return_exceptions=True)
            for recorded in self.events:
                if isinstance(recorded, Redeployed):
                    recorded.probes = list(self.probes)
            self.finished = True  # the load may stop; Ray's last answers are still awaited
            self.stop.set()
            await asyncio.gather(*self.views, return_exceptions=True)

    async def converge(self, step: Step, event: StepEvent) -> bool:
        deadline = time.monotonic() + self.plan.converge_timeout_s
        while time.monotonic() < deadline:
            live = self.checker.live()
            if step.converged(live, event):
                event.converged, event.converged_t, event.replicas_after = True, self.now(), sorted(live)
                event.converge_s = self.now() - event.t
                log.info(
                    "t = %.0f s: %s converged in %.0f s: serving %s",
                    self.now(),
                    step.kind,
                    event.converge_s,
                    sorted(live),
                )
                self.look(event)
                return True
            await asyncio.sleep(2.0)
        serving = sorted(self.checker.live())
        event.replicas_after = serving
        event.why = (
            f"{len(serving)} replica(s) serving after {self.plan.converge_timeout_s:.0f} s, want "
            f"{step.wanted(set(event.replicas_before))}" + (" new ones" if step.kind == "redeploy" else "")
        )
        self.look(event)
        log.error("t = %.0f s: %s did not converge: %s", self.now(), step.kind, event.why)
        return False

    def look(self, event: StepEvent) -> None:
        """Ask Ray what it sees into ``event.ray``, beside the schedule: under the load Ray's state API and
        ``serve status`` can take minutes to answer, and the next step must not wait for them."""
        if self.deployment.cluster is None:
            return

        async def view() -> None:
            event.ray = await asyncio.to_thread(self.ray_view, set(event.replicas_after))

        self.views.append(asyncio.create_task(view()))

    def ray_view(self, serving: set[str] | None = None) -> dict[str, Any]:
        """What Ray says now: each engine replica's node, the nodes' states, the app's status and message; the
        cores of the engines of ``serving`` (the replicas the step left serving: a stopped one still draining is
        listed by Ray but its cores no longer matter)."""
        cluster = self.deployment.cluster
        view: dict[str, Any] = {}
        try:
            replicas = cluster.replicas()
            view["replicas"] = {replica_id(a.get("name", "")): a.get("node_id", "")[:8] for a in replicas}
            view["engine_cores"] = engine_cores_view(
                [a for a in replicas if not serving or replica_id(a.get("name", "")) in serving]
            )
            view["nodes"] = {n.get("node_id", "")[:8]: n.get("state") for n in cluster.all_nodes()}
            apps = cluster.serve_status(timeout=240).get("applications") or {}  # slow under the load
            view["apps"] = {
                name: {
                    "status": a.get("status"),
                    "message": (a.get("message") or "")[:500],
                    "deployments": {
                        d: {
                            "status": s.get("status"),
                            "message": (s.get("message") or "")[:500],
                            "replica_states": s.get("replica_states"),
                        }
                        for d, s in (a.get("deployments") or {}).items()
                    },
                }
                for name, a in apps.items()
            }
        except VIEW_ERRORS as e:  # a slow state API is not a finding about the operation
            view["error"] = f"{type(e).__name__}: {e}"[:300]
        return view

    # -------------------------------------------------------------- affinity
    async def check_affinity(self, session: aiohttp.ClientSession, event: StepEvent) -> None:
        """Pause the load, check routing affinity on the replicas now serving (:mod:`load_tests.operate.affinity`),
        resume; the result goes to ``event.affinity`` (the verdict reads its problems). A check that could not be
        carried out is recorded with that as its problem."""
        assert isinstance(event, Scaled)
        t, started = self.now(), time.monotonic()
        if self.gate is None:
            check = AffinityCheck(
                t, [], {}, why="an affinity check needs the load loop's gate (load_tests.runner.loop)"
            )
            event.affinity = check.record()
            return
        self.gate.clear()
        try:
            before = await self.wait_idle(t)
            if before is None:
                check = AffinityCheck(
                    t,
                    [],
                    {},
                    why=f"the deployment did not go idle within "
                    f"{self.plan.affinity_idle_timeout_s:.0f} s of pausing the load",
                )
            else:
                statuses: list[int | None] = []
                check = AffinityCheck(
                    t, affinity_keys(list(before), self.model, self.prefix_chars()), before, statuses=statuses
                )
                for key in check.keys:
                    for i in range(key.count):  # one after another: each sees an idle deployment
                        statuses.append(await self.post(session, key.body(self.model, i)))
                check.after = await self.wait_idle(self.now())
        except AFFINITY_ERRORS as e:  # the verdict must hear of it: the check is part of the step
            log.error("t = %.0f s: affinity check failed: %s", self.now(), e)
            check = AffinityCheck(t, [], {}, why=f"not carried out: {type(e).__name__}: {e}"[:500])
        finally:
            self.gate.set()
        check.paused_s = time.monotonic() - started
        event.affinity = check.record()
        log.info(
            "t = %.0f s: affinity on %d replica(s), load paused %.0f s: %s",
            self.now(),
            len(check.before),
            check.paused_s,
            "; ".join(check.problems()) or f"every key on its replica {check.served}",
        )

    async def wait_idle(self, since: float) -> dict[str, float] | None:
        """Each live replica's requests_total once the monitor's scrapes since ``since`` show the deployment idle."""
        deadline = time.monotonic() + self.plan.affinity_idle_timeout_s
        while time.monotonic() < deadline:
            counts = idle_counts(self.checker, since, self.settle_s)
            if counts is not None:
                return counts
            await asyncio.sleep(2.0)
        return None

    async def post(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> int | None:
        """An affinity request's status; None if it could not be sent."""
        try:
            return (await self.complete(session, body))[0]
        except HTTP_ERRORS as e:  # recorded as a failed request (None) in the check
            log.warning("affinity request failed: %s: %s", type(e).__name__, e)
            return None

    async def complete(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[int, str]:
        """One completion request of this operator's own (not the load's): its status and body. Those answered
        200 are counted (:attr:`completed`): the engines count them too. A refusal at the ingress is sent again
        when the load's requests are (:mod:`load_tests.load.client`)."""
        refusals: list[str] = []
        async with post_past_ingress_refusals(
            session,
            f"{self.target.base_url}/v1/completions",
            refusals,
            self.retry_delays_s,
            json=body,
            headers=self.target.headers,
        ) as r:
            text = await r.text()
        if refusals:
            log.info(
                "t = %.0f s: the operator's request was refused at the ingress %d time(s) (%s), then answered %d",
                self.now(),
                len(refusals),
                refusals,
                r.status,
            )
        self.completed += r.status == 200
        return r.status, text

    def prefix_chars(self) -> int:
        """The fuzz-aware router's prefix length as deployed (its default unless the config sets it)."""
        config = self.deployment.config
        chars = None if config is None else deploy_config.request_router_kwarg(config, "prefix_chars")
        if chars is not None:
            return int(chars)
        return DEFAULT_PREFIX_CHARS

    # -------------------------------------------------------------- probes
    async def prober(self, session: aiohttp.ClientSession) -> None:
        """A tiny completion with the newly allowed ``vllm_xargs`` key, every ``probe_every_s``: its answer says
        which side of the redeploy the replica that served it is on. Times are kept to the ms: a probe answered
        just after the step began is not before it."""
        key = self.plan.probe_key
        if key is None:
            return
        body = {"model": self.model, "prompt": "probe", "max_tokens": 1, "vllm_xargs": {key: 1}}
        while True:
            t = self.now()
            try:
                status, text = await self.complete(session, body)
                probe = GuardProbe(t=round(t, 3), status=status, names_key=key in text, answered=round(self.now(), 3))
            except HTTP_ERRORS as e:  # recorded: a probe that cannot reach the app is evidence too
                log.warning("probe failed: %s: %s", type(e).__name__, e)
                probe = GuardProbe(t=round(t, 3), status=None, names_key=False, answered=round(self.now(), 3))
            self.probes.append(probe)
            await asyncio.sleep(self.plan.probe_every_s)
