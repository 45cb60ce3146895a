"""A local deployment for a load run: a Ray cluster on this machine with the config deployed under a scenario's
engine settings (faults, KV pool size), and the fault-free reference deployment the probes are compared with.

How it is deployed is a typed :class:`DeploySettings` (the CLI builds one
from its flags; ``testkit.monitoring`` builds one directly). The fixture
model is built first (``fixture_model.build``), as any deployer of
``serve_config.yaml`` must: the app builder builds no model.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Literal

import aiohttp
from pydantic import BaseModel, ConfigDict, Field

from fixture_model.build import ensure_model
from patches.framework.switches import OFF_ENV
from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig
from serve_app.routing.routers import Routing

from ..errors import SetupError
from ..load.client import RequestResult, send
from ..plan.probes import probe_specs
from ..plan.scenarios import Scenario
from .local_cluster import DEFAULT_CONFIG, LocalCluster
from .target import LoadTarget

# A local deployment runs this many engine replicas unless told otherwise: the
# shipped config's `engine_replicas: fit` gives one on a 2-core host, and the
# load tests exist to check routing and per-replica counters across several.
DEFAULT_REPLICAS = 2


class DeploySettings(BaseModel):
    """How the load tests deploy the config locally (what differs from the config itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config: Path | None = Field(None, description="the Serve config (default: serve_config.yaml)")
    http_port: int | None = Field(None, description="overrides the config's HTTP port")
    patches_off: str | None = Field(None, description=f"{OFF_ENV} for the cluster, for A/B runs")
    replicas: int | Literal["fit"] = Field(DEFAULT_REPLICAS, description="the config's engine_replicas")
    routing: Routing | None = Field(None, description="the engine replicas' request router (default: the config's)")


def scenario_config(cfg: ServeConfig, sc: Scenario, settings: DeploySettings) -> ServeConfig:
    """The Serve config ``cfg`` with the scenario's engine settings, the replica count (or the scenario's
    autoscaling) and the routing of ``settings`` (a new config; ``cfg`` unchanged)."""
    cfg = deploy_config.with_engine_kwargs(cfg, sc.engine_overrides)
    cfg = deploy_config.with_routing(cfg, settings.routing)
    cfg = deploy_config.with_engine_replicas(cfg, settings.replicas)
    if sc.autoscaling is not None:  # Serve's autoscaler sizes the deployment, not engine_replicas
        cfg = deploy_config.with_autoscaling(cfg, sc.autoscaling)
    return cfg


def deploy(sc: Scenario, settings: DeploySettings, out: Path, console):
    """Start a local cluster and deploy the config with the scenario's engine settings; the cluster."""
    ensure_model()
    cfg = scenario_config(deploy_config.load(settings.config or DEFAULT_CONFIG), sc, settings)
    env = {OFF_ENV: settings.patches_off} if settings.patches_off else {}
    # 'fit' sizes the replicas to the cluster's CPUs: the cluster then has the host's own count, as `ray start`
    # gives it (a fixed replica count runs in LocalCluster's default cluster, whatever the host)
    sized: dict[str, Any] = {"num_cpus": None} if settings.replicas == "fit" else {}
    if sc.cluster is not None:  # the scenario's nodes (node-loss: a worker to lose, room on the head to recover)
        sized = {
            "multi_node": True,
            "workers": sc.cluster.workers,
            "num_cpus": sc.cluster.head_cpus,
            "worker_num_cpus": sc.cluster.worker_cpus,
        }
    cluster = LocalCluster(env=env, log_dir=out / "cluster", **sized)
    t = time.monotonic()
    try:
        with console.status("starting a local Ray cluster and deploying (a few minutes on 2 cores)"):
            cluster.start()
            cluster.deploy(cfg, http_port=settings.http_port)
    except BaseException:
        cluster.close()
        raise
    replicas = cluster.replicas()
    if sc.cluster is not None:
        for _ in range(sc.cluster.spare_workers):
            cluster.add_worker(sc.cluster.worker_cpus)
    console.print(
        f"deployed in {time.monotonic() - t:.0f} s: {len(replicas)} engine replicas behind "
        f"{cluster.base_url} on {len({r.get('node_id') for r in replicas})} of {len(cluster.nodes)} node(s); "
        f"cluster logs in {cluster.log_dir}"
    )
    if sc.cluster is not None and sc.cluster.workers and len({r.get("node_id") for r in replicas}) < 2:
        cluster.close()
        raise SetupError(
            f"scenario {sc.name} needs a replica on a worker node, but Ray placed all {len(replicas)} on one node"
        )
    return cluster


def probe_reference(
    sc: Scenario, settings: DeploySettings, out: Path, console, api_key: str | None
) -> tuple[list[RequestResult], list[RequestResult]]:
    """Deploy the same config without faults, send the probe set twice, tear down: the two rounds' results
    (:func:`load_tests.judge.probes.reference` judges them)."""
    fault_free = sc.model_copy(update={"faults": None, "kill_replica_at_s": None})
    cluster = deploy(fault_free, settings, out / "reference", console)
    target = LoadTarget(cluster.base_url, cluster.metrics_urls, api_key, cluster)
    try:
        first, second = asyncio.run(_probe_rounds(target, sc))
    finally:
        with console.status("shutting the fault-free cluster down"):
            cluster.close(graceful=False)  # its probes are answered: nothing to drain
    return first, second


async def _probe_rounds(target: LoadTarget, sc: Scenario) -> list[list[RequestResult]]:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as session:
        return [
            list(
                await asyncio.gather(
                    *(send(session, target.base_url, s, t0, headers=target.headers) for s in probe_specs(rnd, sc.mix))
                )
            )
            for rnd in (0, 1)
        ]
