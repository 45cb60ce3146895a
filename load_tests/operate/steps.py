"""One class per operation kind: how the step is carried out, when it has converged, and how its own evidence is
judged. The operator (:mod:`load_tests.operate.operator`) and the judge (:mod:`load_tests.judge.evidence`) look a
step's class up by its kind (:data:`STEP_TYPES`); neither branches on the kind.

Convergence is read from the monitor's scrapes, not from Ray's state API
(which can take a minute to answer under full load on 2 cores): a replica
serves while Serve's health gauge says healthy (:meth:`InvariantChecker.live`).

* **redeploy**: ``serve deploy`` of the same app with changed ``args`` (an
  engine setting, which makes Serve replace every replica, and a new
  ``vllm_xargs`` key allowed by the guard, which a probe request sees):
  converged when as many replicas serve as before and none of them is an
  old one. Its probes must be refused (400 naming the key) before it and
  accepted after it converged.
* **scale**: the engine deployment's ``num_replicas`` in the YAML's
  ``deployments:`` section (Serve changes it in place: no replica restarts):
  converged when that many serve; then, if the plan asks, the routing
  affinity check (:mod:`load_tests.operate.affinity`).
* **autoscale**: the load changes to ``concurrency`` requests in flight (the
  deployment runs Serve's ``autoscaling_config``): converged when Serve's
  autoscaler has ``replicas`` serving.
* **node_loss**: SIGKILL, by pid, a worker node's ``ray start --block``
  process and every process under it (raylet, agents, replicas, engines):
  the node is gone, not one replica. Its metrics endpoint is declared lost to
  the monitor (:meth:`InvariantChecker.lose_endpoint`) and its replicas dead
  from the kill; converged when as many replicas serve as before the loss
  and none of the lost ones.

With ``--url`` the run cannot act on the deployment: a redeploy or a scale is
printed for the person operating it to carry out, and the same data judges
it; a node loss needs a local cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import psutil

from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig

from ..errors import StepError
from ..load.drive import LoadLevel
from ..observe.monitor import InvariantChecker
from ..plan.steps import Autoscale, NodeLoss, Operation, Redeploy, Scale
from ..results.events import AffinityRecord, Autoscaled, GuardProbe, NodeLost, Redeployed, Scaled, StepEvent

log = logging.getLogger("fuzzserve.load_tests")


@dataclass
class Deployment:
    """What the steps act on: the local cluster (None with ``--url``), the monitor's view, the load's level (for
    autoscale steps), and the Serve config as last applied (each redeploy or scale applies a changed copy)."""

    cluster: Any
    checker: InvariantChecker
    level: LoadLevel | None = None
    config: ServeConfig | None = None
    declare_lost: bool = True  # False: the failing twin, whose lost endpoint must fail the run
    applied: int = 0

    def deployed(self) -> ServeConfig:
        """The Serve config as last applied (a local cluster keeps what it deployed)."""
        if self.config is None:
            raise StepError("the local cluster did not keep the config it deployed: nothing to change")
        return self.config

    async def apply(self, config: ServeConfig, name: str) -> None:
        self.applied += 1
        self.config = config
        await asyncio.to_thread(self.cluster.apply, config, name)


class Step:
    """A plan step's behaviour; subclasses set :attr:`kind` and :attr:`event`."""

    kind: ClassVar[str]
    event: ClassVar[type[StepEvent]]
    checks_affinity: ClassVar[bool] = False  # the plan's affinity check runs after this kind converged

    def __init__(self, step: Operation):
        self.step = step

    async def perform(self, d: Deployment, t: float, before: list[str]) -> StepEvent:
        """Carry the step out; the event records what was done (converged later)."""
        raise NotImplementedError

    def wanted(self, before: set[str]) -> int:
        """How many replicas must serve for the step to have converged."""
        return len(before)

    def converged(self, live: set[str], event: StepEvent) -> bool:
        return len(live) == self.wanted(set(event.replicas_before))

    def judge(self, event: StepEvent, what: str, problems: list[str], evidence: list[str]) -> None:
        """The kind's own evidence, beyond what every step is judged on (converged, new replicas served)."""

    def _by_operator(self, t: float, before: list[str], what: str, **fields: Any) -> StepEvent:
        log.warning("operator, at t = %.0f s: %s now", t, what)
        return self.event(t=t, step=self.step, by="operator", replicas_before=before, **fields)


class RedeployStep(Step):
    kind, event = "redeploy", Redeployed
    step: Redeploy

    async def perform(self, d: Deployment, t: float, before: list[str]) -> StepEvent:
        if d.cluster is None:
            return self._by_operator(
                t,
                before,
                f"serve deploy your config with engine_kwargs "
                f"{self.step.engine_kwargs} and guard.xargs.allowed_extra_keys + "
                f"{list(self.step.allow_xargs)}",
            )
        changed = deploy_config.redeployed(d.deployed(), self.step.engine_kwargs, self.step.allow_xargs)
        await d.apply(changed, f"redeploy-{d.applied + 1}")
        return Redeployed(t=t, step=self.step, by="serve deploy", replicas_before=before)

    def converged(self, live: set[str], event: StepEvent) -> bool:
        return super().converged(live, event) and not live & set(event.replicas_before)

    def judge(self, event: StepEvent, what: str, problems: list[str], evidence: list[str]) -> None:
        assert isinstance(event, Redeployed)
        judge_probes(event, problems, evidence)


class ScaleStep(Step):
    kind, event = "scale", Scaled
    checks_affinity = True
    step: Scale

    async def perform(self, d: Deployment, t: float, before: list[str]) -> StepEvent:
        if d.cluster is None:
            return self._by_operator(t, before, f"set the engine deployment's num_replicas to {self.step.replicas}")
        await d.apply(deploy_config.scaled(d.deployed(), self.step.replicas), f"scale-{self.step.replicas}")
        return Scaled(t=t, step=self.step, by="serve deploy (deployments: num_replicas)", replicas_before=before)

    def wanted(self, before: set[str]) -> int:
        return self.step.replicas

    def judge(self, event: StepEvent, what: str, problems: list[str], evidence: list[str]) -> None:
        assert isinstance(event, Scaled)
        if event.affinity is not None:
            judge_affinity(event.affinity, what, problems, evidence)


class AutoscaleStep(Step):
    kind, event = "autoscale", Autoscaled
    step: Autoscale

    async def perform(self, d: Deployment, t: float, before: list[str]) -> StepEvent:
        if d.level is None:
            raise StepError("an autoscale step needs the load driven at a level (load_tests.load.drive.drive_levels)")
        d.level.set(self.step.concurrency)
        return Autoscaled(
            t=t,
            step=self.step,
            by=f"load -> {self.step.concurrency} in flight (Serve's autoscaler)",
            replicas_before=before,
        )

    def wanted(self, before: set[str]) -> int:
        return self.step.replicas


class NodeLossStep(Step):
    kind, event = "node_loss", NodeLost
    step: NodeLoss

    async def perform(self, d: Deployment, t: float, before: list[str]) -> StepEvent:
        if d.cluster is None:
            raise StepError("a node-loss step needs a local cluster (no --url): the run must know the node")
        return await asyncio.to_thread(self.kill_node, d, t, before)

    def kill_node(self, d: Deployment, t: float, before: list[str]) -> NodeLost:
        """SIGKILL every process of the step's node (its ``ray start --block`` and all under it), by pid."""
        name = self.step.node
        node = next((n for n in d.cluster.nodes if n.name == name), None)
        if node is None or node is d.cluster.nodes[0]:
            raise StepError(
                f"node-loss: {name!r} is not a worker node of this cluster ({[n.name for n in d.cluster.nodes[1:]]})"
            )
        # declared before the kill: the monitor's next scrape of the endpoint already fails
        lost = (
            d.checker.lose_endpoint(node.metrics_url, t) if d.declare_lost else d.checker.replicas_on(node.metrics_url)
        )
        procs = [psutil.Process(node.proc.pid), *node.descendants()]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        psutil.wait_procs(procs, timeout=10)
        log.info("killed node %s: %d processes; its replicas %s", name, len(procs), lost)
        return NodeLost(
            t=t,
            step=self.step,
            by="SIGKILL",
            replicas_before=before,
            node=name,
            pids=[p.pid for p in procs],
            endpoint=node.metrics_url,
            replicas=sorted(lost),
        )

    def converged(self, live: set[str], event: StepEvent) -> bool:
        assert isinstance(event, NodeLost)
        return super().converged(live, event) and not live & set(event.replicas)

    def judge(self, event: StepEvent, what: str, problems: list[str], evidence: list[str]) -> None:
        assert isinstance(event, NodeLost)
        if not event.replicas:
            problems.append(f"{what}: node {event.node} held no replica (nothing was lost: place one there)")


STEP_TYPES: dict[str, type[Step]] = {c.kind: c for c in (RedeployStep, ScaleStep, AutoscaleStep, NodeLossStep)}


def step_of(step: Operation) -> Step:
    return STEP_TYPES[step.kind](step)


def judge_affinity(check: AffinityRecord, what: str, problems: list[str], evidence: list[str]) -> None:
    """A scale step's affinity check: each key's requests on the replica the router hashes it to."""
    if check.problems:
        problems += [f"{what}: routing affinity: {p}" for p in check.problems]
        return
    evidence.append(
        f"affinity: {len(check.keys)} fuzz setting(s) + prefix, {sum(k.count for k in check.keys)} "
        f"requests, each on the replica the router's hash names (load paused {check.paused_s:.0f} s)"
    )


def judge_probes(event: Redeployed, problems: list[str], evidence: list[str]) -> None:
    """A redeploy's probes: those answered before the redeploy began refused naming the key, those sent after it
    converged accepted (one in flight across either moment may get either answer)."""
    key = next(iter(event.step.allow_xargs), None)
    if key is None:
        return
    probes: list[GuardProbe] = event.probes
    before = [p for p in probes if p.answered < event.t]
    after = [p for p in probes if event.converged_t is not None and p.t >= event.converged_t]
    if not before or not after:
        problems.append(
            f"probes of vllm_xargs.{key}: {len(before)} before the redeploy, {len(after)} after it "
            "converged (need both)"
        )
        return
    refused = sum(p.status == 400 and p.names_key for p in before)
    accepted = sum(p.status == 200 for p in after)
    evidence.append(
        f"probe vllm_xargs.{key}: {refused}/{len(before)} refused naming it before, "
        f"{accepted}/{len(after)} accepted after"
    )
    if refused < len(before):
        problems.append(f"vllm_xargs.{key} before the redeploy: {len(before) - refused} probe(s) not refused naming it")
    if accepted < len(after):
        problems.append(f"vllm_xargs.{key} after the redeploy converged: {len(after) - accepted} probe(s) not accepted")
    odd = [p for p in probes if p.status not in (200, 400)]
    if odd:
        problems.append(f"{len(odd)} probe(s) got neither 200 nor 400, first at t = {odd[0].t} s: {odd[0].status}")
