"""Operations under load: redeploy the app, scale its engine replicas, lose a whole node, while the load runs.

A scenario with ``operations`` (:class:`OperationPlan`) runs its steps one
after another beside the load (:class:`Operator`): each step waits
``after_s`` (after the load started, or after the previous step converged),
is carried out, and is then watched until it *converged*: the replicas
serving are the ones the step asked for. The load runs on for ``tail_s``
after the last step and then stops (the profile's duration is only a cap).

Convergence is read from the monitor's scrapes, not from Ray's state API
(which can take a minute to answer under full load on 2 cores): a replica
serves while Serve's health gauge says healthy (:meth:`InvariantChecker.live`).

* **redeploy**: ``serve deploy`` of the same app with changed ``args`` (an
  engine setting, which makes Serve replace every replica, and a new
  ``vllm_xargs`` key allowed by the guard, which a probe request sees):
  converged when as many replicas serve as before and none of them is an
  old one. A probe is sent every ``probe_every_s`` for the whole run: it
  must be refused (400 naming the key) before the redeploy and accepted
  after it converged.
* **scale**: the engine deployment's ``num_replicas`` in the YAML's
  ``deployments:`` section (Serve changes it in place: no replica restarts):
  converged when that many serve.
* **autoscale**: the load changes to ``concurrency`` requests in flight (the
  deployment runs Serve's ``autoscaling_config``; the scenario's low and high
  load phases): converged when Serve's autoscaler has ``replicas`` serving.
* **node_loss**: SIGKILL, by pid, a worker node's ``ray start --block``
  process and every process under it (raylet, agents, replicas, engines):
  the node is gone, not one replica. Its metrics endpoint is declared lost to
  the monitor (:meth:`InvariantChecker.lose_endpoint`) and its replicas dead
  from the kill; converged when as many replicas serve as before the loss
  (Serve rescheduled the lost ones on the surviving nodes).

Replicas that Serve stops during a redeploy or a scale-down are *retired*,
not dead: their health gauge drops to 0 without a failed health check
(``ray_serve_health_check_failures_total``), which a crash, a hang or a lost
node always shows (:func:`planned_departures`). With ``--url`` the CLI
cannot act on the deployment: each step is printed for the operator to
carry out, and the same data judges it (node loss needs a local cluster).

Each step is recorded as a :class:`~load_tests.results.Fault` (what was done,
when it converged, the replicas before and after, the probes) and the
verdict requires its evidence (:mod:`load_tests.fault_evidence`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field

from serve_app.names import ENGINE_DEPLOYMENT_PREFIX, replica_id

from .client import post_past_ingress_refusals

if TYPE_CHECKING:
    import aiohttp

    from .results import Fault

    from .monitor import InvariantChecker
    from .target import LoadTarget

log = logging.getLogger("fuzzserve.load_tests")

# Replicas that change hands while the load runs are the operations' business; these are the Fault kinds.
OPERATION_KINDS = ("redeploy", "scale", "autoscale", "node_loss")
# Operations after which Serve stops healthy replicas on purpose (retirements, not deaths).
RETIRING = ("redeploy", "scale", "autoscale")
# Serve's controller log line when a replica did not drain within its graceful shutdown timeout.
FORCE_KILL_LINE = re.compile(r"did not shut down after grace period, force-killing it")


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    after_s: float = Field(ge=0, description="seconds after the load started (first step) or the previous step "
                                             "converged")


class Redeploy(_Step):
    kind: Literal["redeploy"] = "redeploy"
    engine_kwargs: dict[str, Any] = Field(default_factory=dict,
                                          description="merged into every llm_config's engine_kwargs (any change "
                                                      "under the app's args makes Serve replace every replica)")
    allow_xargs: tuple[str, ...] = Field((), description="vllm_xargs keys the guard allows after the redeploy "
                                                         "(refused before): the change a probe can see")


class Scale(_Step):
    kind: Literal["scale"] = "scale"
    replicas: int = Field(ge=1, description="the engine deployment's num_replicas (changed in place)")


class Autoscale(_Step):
    kind: Literal["autoscale"] = "autoscale"
    concurrency: int = Field(ge=1, description="the load's requests in flight from this step on")
    replicas: int = Field(ge=1, description="the replicas Serve's autoscaler must reach at that load")


class NodeLoss(_Step):
    kind: Literal["node_loss"] = "node_loss"
    node: str = Field("worker1", description="the local cluster's node to kill (a worker: the head holds Serve)")


Operation = Annotated[Redeploy | Scale | Autoscale | NodeLoss, Field(discriminator="kind")]


class OperationPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: tuple[Operation, ...] = Field(min_length=1)
    converge_timeout_s: float = Field(480.0, gt=0, description="a step that has not converged by then fails the run")
    tail_s: float = Field(45.0, ge=0, description="load after the last step converged")
    probe_every_s: float = Field(5.0, gt=0, description="between guard probes (plans with allow_xargs)")
    affinity_check: bool = Field(False, description="after each scale step converged: pause the load and check that "
                                                    "a fuzz setting + prefix lands on the replica the router's hash "
                                                    "names (load_tests.affinity)")
    affinity_idle_timeout_s: float = Field(180.0, gt=0, description="for the paused deployment to go idle")

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.kind for s in self.steps))

    @property
    def changes_load(self) -> bool:
        return any(isinstance(s, Autoscale) for s in self.steps)

    @property
    def probe_key(self) -> str | None:
        """The vllm_xargs key the probes send: the first a redeploy newly allows."""
        return next((k for s in self.steps if isinstance(s, Redeploy) for k in s.allow_xargs), None)


def redeployed_config(cfg: dict[str, Any], step: Redeploy) -> dict[str, Any]:
    """``cfg`` (a Serve config document) with ``step``'s engine settings and allowed xargs keys."""
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        args = app.setdefault("args", {})
        for llm in args.get("llm_configs", []):
            llm.setdefault("engine_kwargs", {}).update(copy.deepcopy(step.engine_kwargs))
        if step.allow_xargs:
            xargs = args.setdefault("guard", {}).setdefault("xargs", {})
            xargs["allowed_extra_keys"] = [*xargs.get("allowed_extra_keys", []),
                                           *(k for k in step.allow_xargs if k not in xargs.get("allowed_extra_keys", []))]
    return new


def scaled_config(cfg: dict[str, Any], replicas: int) -> dict[str, Any]:
    """``cfg`` with every engine deployment's ``num_replicas`` overridden in the ``deployments:`` section (Serve
    applies it in place; the same number under ``args`` would restart every replica)."""
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        deployments = app.setdefault("deployments", [])
        for llm in app.get("args", {}).get("llm_configs", []):
            name = ENGINE_DEPLOYMENT_PREFIX + llm["model_loading_config"]["model_id"]
            entry = next((d for d in deployments if d.get("name") == name), None)
            if entry is None:
                deployments.append(entry := {"name": name})
            entry["num_replicas"] = replicas
    return new


def planned_departures(checker: InvariantChecker, faults: list[Fault], listed_dead: list[str] = ()) -> dict[str, str]:
    """Replicas that left because of an operation the run made, and why (the rest of the deaths are unplanned).

    * lost with a node the run killed (the node's replicas, from the monitor);
    * retired: gone after a redeploy, scale or autoscaling step began, with no failed health check (Serve stopped a healthy
      replica; a crash, a hang or a lost node fails its health checks first).
    """
    out: dict[str, str] = {}
    for f in faults:
        if f.kind == "node_loss":
            for key in f.detail.get("replicas", []):
                out[key] = f"lost with node {f.detail.get('node')} at t = {f.t:.0f} s"
    starts = [f.t for f in faults if f.kind in RETIRING]
    if not starts:
        return out
    final, baseline = checker.final(), checker.baseline()
    for key in (set(checker.deaths) | set(listed_dead)) - set(out):
        died = checker.deaths.get(key)
        if died is not None and died < min(starts):
            continue
        failed = (final[key].health_check_failures - (baseline[key].health_check_failures if key in baseline else 0.0)
                  if key in final else 0.0)
        if failed <= 0:
            op = max((f for f in faults if f.kind in RETIRING and (died is None or f.t <= died)),
                     key=lambda f: f.t, default=None)
            out[key] = f"retired by Serve after the {op.kind if op else 'operation'}" + (
                f" at t = {op.t:.0f} s" if op else "") + " (no failed health check)"
    return out


class Operator:
    """Carries out an :class:`OperationPlan` beside the load (local cluster), or tells the operator to (``--url``)."""

    def __init__(self, plan: OperationPlan, target: LoadTarget, checker: InvariantChecker, t0: float,
                 stop: asyncio.Event, faults: list[Fault], model: str, declare_lost: bool = True,
                 level: LoadLevel | None = None, gate: asyncio.Event | None = None, settle_s: float = 11.0):
        self.plan, self.target, self.checker, self.t0, self.stop = plan, target, checker, t0, stop
        self.model, self.declare_lost, self.level = model, declare_lost, level
        self.gate = gate  # set while the load may start requests (cleared for an affinity check)
        self.settle_s = settle_s  # two idle scrapes this far apart mean idle (the monitor's settle interval)
        self.faults = faults  # the run's list: a step is recorded when it starts, completed when it converges
        self.probes: list[dict[str, Any]] = []
        self.completed = 0  # this operator's requests answered 200 (the engines count them too)
        self.views: list[asyncio.Task] = []  # Ray's view after each step (look), gathered at the end
        self.finished = False
        self.errors: list[str] = []  # steps that could not be carried out, and why
        self.cluster = target.cluster
        self.config = copy.deepcopy(getattr(self.cluster, "deployed_config", None))

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self, session: aiohttp.ClientSession) -> None:
        prober = asyncio.create_task(self.prober(session)) if self.plan.probe_key else None
        try:
            for step in self.plan.steps:
                await asyncio.sleep(step.after_s)
                try:
                    fault = await self.perform(step)
                except Exception as e:  # e.g. `serve deploy` refused the config: the step never happened
                    log.error("t = %.0f s: %s could not be carried out: %s", self.now(), step.kind, e)
                    self.errors.append(f"{step.kind}: {type(e).__name__}: {e}"[:500])
                    break
                self.faults.append(fault)
                if not await self.converge(step, fault):
                    break
                if self.plan.affinity_check and isinstance(step, Scale):
                    try:
                        await self.check_affinity(session, fault)
                    except Exception as e:  # the verdict must hear of it: the check is part of the step
                        log.error("t = %.0f s: affinity check failed: %s", self.now(), e)
                        fault.detail["affinity"] = {"problems": [f"not carried out: {type(e).__name__}: {e}"[:500]]}
            await asyncio.sleep(self.plan.tail_s)
        finally:
            if prober is not None:
                prober.cancel()
                await asyncio.gather(prober, return_exceptions=True)
            self.finished = True  # the load may stop; Ray's last answers are still awaited
            self.stop.set()
            await asyncio.gather(*self.views, return_exceptions=True)

    # -------------------------------------------------------------- steps
    async def perform(self, step: Operation) -> Fault:
        from .results import Fault  # load_tests.results reads the scenarios, which read this module

        before = sorted(self.checker.live())
        t = self.now()
        detail: dict[str, Any] = {"step": step.model_dump(), "replicas_before": before, "converged": False}
        if isinstance(step, Autoscale) and self.level is None:
            raise SystemExit("an autoscale step needs the load to be driven by load_tests.operations.drive_levels")
        if self.cluster is None and not isinstance(step, Autoscale):
            if isinstance(step, NodeLoss):
                raise SystemExit("a node-loss step needs a local cluster (no --url): the run must know the node")
            what = (f"serve deploy your config with engine_kwargs {step.engine_kwargs} and guard.xargs."
                    f"allowed_extra_keys + {list(step.allow_xargs)}" if isinstance(step, Redeploy)
                    else f"set the engine deployment's num_replicas to {step.replicas}")
            log.warning("operator, at t = %.0f s: %s now", t, what)
            detail["by"] = "operator"
        elif isinstance(step, Redeploy):
            self.config = redeployed_config(self.config, step)
            await asyncio.to_thread(self.cluster.apply, self.config, f"redeploy-{len(self.faults) + 1}")
            detail["by"] = "serve deploy"
        elif isinstance(step, Autoscale):
            self.level.set(step.concurrency)
            detail["by"] = f"load -> {step.concurrency} in flight (Serve's autoscaler)"
        elif isinstance(step, Scale):
            self.config = scaled_config(self.config, step.replicas)
            await asyncio.to_thread(self.cluster.apply, self.config, f"scale-{step.replicas}")
            detail["by"] = "serve deploy (deployments: num_replicas)"
        else:
            detail.update(await asyncio.to_thread(self.kill_node, step.node, t))
        log.info("t = %.0f s: %s (%s); serving before: %s", t, step.kind, detail.get("by"), before)
        return Fault(step.kind, t, detail)

    def kill_node(self, name: str, t: float) -> dict[str, Any]:
        """SIGKILL every process of node ``name`` (its ``ray start --block`` and all under it), by pid."""
        node = next((n for n in self.cluster.nodes if n.name == name), None)
        if node is None or node is self.cluster.nodes[0]:
            raise SystemExit(f"node-loss: {name!r} is not a worker node of this cluster "
                             f"({[n.name for n in self.cluster.nodes[1:]]})")
        # declared before the kill: the monitor's next scrape of the endpoint already fails
        if self.declare_lost:
            lost = self.checker.lose_endpoint(node.metrics_url, t)
        else:  # the failing twin: the monitor is not told, so the lost endpoint must fail the run
            lost = self.checker.replicas_on(node.metrics_url)
        procs = [psutil.Process(node.proc.pid), *node.descendants()]
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=10)
        log.info("killed node %s: %d processes; its replicas %s", name, len(procs), lost)
        return {"by": "SIGKILL", "node": name, "pids": [p.pid for p in procs], "endpoint": node.metrics_url,
                "replicas": lost}

    async def converge(self, step: Operation, fault: Fault) -> bool:
        before = set(fault.detail["replicas_before"])
        lost = set(fault.detail.get("replicas", ()))
        want = step.replicas if isinstance(step, (Scale, Autoscale)) else len(before)
        deadline = time.monotonic() + self.plan.converge_timeout_s
        while time.monotonic() < deadline:
            live = self.checker.live()
            if len(live) == want and not (isinstance(step, Redeploy) and live & before) and not live & lost:
                fault.detail.update(converged=True, converged_t=self.now(), replicas_after=sorted(live),
                                    converge_s=self.now() - fault.t)
                log.info("t = %.0f s: %s converged in %.0f s: serving %s", self.now(), step.kind,
                         fault.detail["converge_s"], sorted(live))
                self.look(fault)
                return True
            await asyncio.sleep(2.0)
        live = sorted(self.checker.live())
        fault.detail.update(replicas_after=live, why=f"{len(live)} replica(s) serving after "
                            f"{self.plan.converge_timeout_s:.0f} s, want {want}" +
                            (" new ones" if isinstance(step, Redeploy) else ""))
        self.look(fault)
        log.error("t = %.0f s: %s did not converge: %s", self.now(), step.kind, fault.detail["why"])
        return False

    def look(self, fault: Fault) -> None:
        """Ask Ray what it sees into ``fault.detail["ray"]``, beside the schedule: under the load Ray's state API
        and ``serve status`` can take minutes to answer, and the next step must not wait for them."""
        if self.cluster is None:
            return

        async def view() -> None:
            fault.detail["ray"] = await asyncio.to_thread(self.ray_view)

        self.views.append(asyncio.create_task(view()))

    def ray_view(self) -> dict[str, Any]:
        """What Ray says now: each engine replica's node, the nodes' states, the app's status and message."""
        view: dict[str, Any] = {}
        try:
            view["replicas"] = {replica_id(a.get("name", "")): a.get("node_id", "")[:8]
                                for a in self.cluster.replicas()}
            view["nodes"] = {n.get("node_id", "")[:8]: n.get("state") for n in self.cluster.all_nodes()}
            apps = self.cluster.serve_status(timeout=240).get("applications") or {}  # slow under the load
            view["apps"] = {name: {"status": a.get("status"), "message": (a.get("message") or "")[:500],
                                   "deployments": {d: {"status": s.get("status"), "message": (s.get("message") or "")[:500],
                                                       "replica_states": s.get("replica_states")}
                                                   for d, s in (a.get("deployments") or {}).items()}}
                            for name, a in apps.items()}
        except Exception as e:  # a slow state API is not a finding about the operation
            view["error"] = f"{type(e).__name__}: {e}"[:300]
        return view

    # -------------------------------------------------------------- affinity
    async def check_affinity(self, session: aiohttp.ClientSession, fault: Fault) -> None:
        """Pause the load, check routing affinity on the replicas now serving (:mod:`load_tests.affinity`),
        resume; the result goes to ``fault.detail["affinity"]`` (the verdict reads its problems)."""
        from .affinity import AffinityCheck, affinity_keys

        t, started = self.now(), time.monotonic()
        if self.gate is None:
            raise SystemExit("an affinity check needs the load loop's gate (load_tests.load_loop)")
        self.gate.clear()
        try:
            before = await self.wait_idle(t)
            if before is None:
                check = AffinityCheck(t, [], {}, why=f"the deployment did not go idle within "
                                                     f"{self.plan.affinity_idle_timeout_s:.0f} s of pausing the load")
            else:
                check = AffinityCheck(t, affinity_keys(list(before), self.model, self.prefix_chars()), before,
                                      statuses=[])
                for key in check.keys:
                    for i in range(key.count):  # one after another: each sees an idle deployment
                        check.statuses.append(await self.post(session, key.body(self.model, i)))
                check.after = await self.wait_idle(self.now())
        finally:
            self.gate.set()
        check.paused_s = time.monotonic() - started
        fault.detail["affinity"] = check.to_json()
        log.info("t = %.0f s: affinity on %d replica(s), load paused %.0f s: %s", self.now(), len(check.before),
                 check.paused_s, "; ".join(check.problems()) or f"every key on its replica {check.served}")

    async def wait_idle(self, since: float) -> dict[str, float] | None:
        """Each live replica's requests_total once the monitor's scrapes since ``since`` show the deployment idle."""
        from .affinity import idle_counts

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
        except Exception as e:  # recorded as a failed request (None) in the check
            log.warning("affinity request failed: %s: %s", type(e).__name__, e)
            return None

    async def complete(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[int, str]:
        """One completion request of this operator's own (not the load's): its status and body. Those answered
        200 are counted (:attr:`completed`): the engines count them too. A refusal at the ingress is sent again,
        as the load's requests are (:mod:`load_tests.client`)."""
        refusals: list[str] = []
        async with post_past_ingress_refusals(session, f"{self.target.base_url}/v1/completions", refusals,
                                              json=body, headers=self.target.headers) as r:
            text = await r.text()
        if refusals:
            log.info("t = %.0f s: the operator's request was refused at the ingress %d time(s) (%s), then "
                     "answered %d", self.now(), len(refusals), refusals, r.status)
        self.completed += r.status == 200
        return r.status, text

    def prefix_chars(self) -> int:
        """The fuzz-aware router's prefix length as deployed (its default unless the config sets it)."""
        from serve_app.routing_keys import DEFAULT_PREFIX_CHARS

        for app in (self.config or {}).get("applications", []):
            for llm in app.get("args", {}).get("llm_configs", []):
                router = llm.get("deployment_config", {}).get("request_router_config", {})
                if "prefix_chars" in router.get("request_router_kwargs", {}):
                    return int(router["request_router_kwargs"]["prefix_chars"])
        return DEFAULT_PREFIX_CHARS

    # -------------------------------------------------------------- probes
    async def prober(self, session: aiohttp.ClientSession) -> None:
        """A tiny completion with the newly allowed ``vllm_xargs`` key, every ``probe_every_s``: its answer says
        which side of the redeploy the replica that served it is on."""
        key = self.plan.probe_key
        body = {"model": self.model, "prompt": "probe", "max_tokens": 1, "vllm_xargs": {key: 1}}
        while True:
            t = self.now()
            try:
                status, text = await self.complete(session, body)
                self.probes.append({"t": t, "status": status, "names_key": key in text, "error": text[:200]
                                    if status != 200 else None, "answered": self.now()})
            except Exception as e:  # recorded: a probe that cannot reach the app is evidence too
                self.probes.append({"t": t, "status": None, "names_key": False, "error": f"{type(e).__name__}: {e}"[:200],
                                    "answered": self.now()})
            await asyncio.sleep(self.plan.probe_every_s)


class LoadLevel:
    """The load's requests in flight, which autoscale steps change while it runs (:func:`drive_levels`)."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.changed = asyncio.Event()
        self.history: list[tuple[float, int]] = []  # (monotonic time, concurrency) of each change

    def set(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.history.append((time.monotonic(), concurrency))
        self.changed.set()


async def drive_levels(level: LoadLevel, one, stop: asyncio.Event) -> int:
    """Keep ``level.concurrency`` requests in flight (``one(index)`` each) until ``stop``; a lower level lets the
    surplus workers finish their request and end, a higher one starts more. How many were started."""
    started = 0
    workers: dict[int, asyncio.Task] = {}

    async def worker(w: int) -> None:
        nonlocal started
        while not stop.is_set() and w < level.concurrency:
            started += 1
            await one(started - 1)

    while not stop.is_set():
        for w in range(level.concurrency):
            if w not in workers or workers[w].done():
                workers[w] = asyncio.create_task(worker(w))
        level.changed.clear()
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(level.changed.wait())]
        await asyncio.wait(waiters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        for f in waiters:
            f.cancel()
    await asyncio.gather(*workers.values())
    return started


def forced_kills(session_dir: Path | None) -> list[str]:
    """Serve's controller log lines saying a replica was force-killed after its graceful shutdown timeout (a
    drain that cut requests); none without a local cluster's Ray session directory."""
    if session_dir is None:
        return []
    lines = []
    for path in sorted(Path(session_dir).glob("logs/serve/controller_*.log")):
        try:
            lines += [ln.strip()[:300] for ln in path.read_text(errors="replace").splitlines() if FORCE_KILL_LINE.search(ln)]
        except OSError:
            continue
    return lines

