"""A whole load run as one library call: :func:`run` deploys (or points at ``--url``), takes the reference, drives
the load with its operations beside the monitor, judges, writes the report, and returns the
:class:`~load_tests.results.models.RunSummary`.

The CLI (:mod:`load_tests.cli`) parses flags into the four typed inputs and
renders what comes back; benchmarks and test rigs call :func:`run` the same
way. Library errors are typed (:mod:`load_tests.errors`): a
:class:`~load_tests.errors.SetupError` means the run could not start as asked.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from fixture_model.tasks import held_out_examples
from patches.framework.switches import is_off

from ..errors import SetupError
from ..judge.departures import unexpected_deaths
from ..judge.evidence import check_planned_faults
from ..judge.hostile import judge_hostile
from ..judge.probes import probe_verdict, reference
from ..judge.repeats import combined
from ..judge.summary import summarize
from ..load.fuzz_sweep import SweepPoint, http_generator, print_table, run_sweep
from ..observe.scraper import discover_metrics_urls
from ..operate.deploy import DeploySettings, deploy, probe_reference
from ..operate.logs import forced_kills
from ..operate.target import LoadTarget, is_local
from ..plan.profiles import SweepPlan
from ..plan.scenarios import Scenario
from ..report.write import write_report
from ..results.models import ProbeReference, RunSummary
from .loop import LoadRun, RunConfig, run_load
from .sweep import SweepDriver

log = logging.getLogger("fuzzserve.load_tests")


class RunTarget(BaseModel):
    """Where the load goes: a local deployment the run starts (``url`` None), or a running one at ``url``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = Field(None, description="base URL of a running deployment (None: deploy locally)")
    metrics_urls: tuple[str, ...] = Field(
        (), description="its nodes' metrics endpoints (default: Ray's service discovery file)"
    )
    api_key: str | None = None
    allow_remote: bool = Field(False, description="allow a url that is not on this machine")


class Outputs(BaseModel):
    """What the run writes and adds beside the load."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: Path = Field(description="the report directory")
    title: str
    repeat: int = Field(1, ge=1, description="runs of the profile on the one deployment")
    fuzz_sweep_per_task: int | None = Field(
        None, ge=1, description="the fuzz sweep through the deployment after the load, this many examples per task"
    )
    fuzz_sweep_layers: tuple[int, ...] = Field(
        (0, 1, -1), min_length=1, description="the sweep's depths (fuzz_layer values; 0: the input embeddings)"
    )
    slo_attainment: float = Field(
        0.95, gt=0, le=1, description="sweep profile: share of a step's complete answers that must meet the SLO"
    )


def check_target(sc: Scenario, target: RunTarget) -> None:
    """Refuse (SetupError) a scenario that needs a cluster of its own pointed at a running deployment."""
    if target.url is None:
        return
    if not target.allow_remote and not is_local(target.url):
        raise SetupError(f"{target.url} is not on this machine; pass --allow-remote to load it anyway")
    if (sc.operations and "node_loss" in sc.operations.kinds) or sc.cluster:
        raise SetupError(f"scenario {sc.name} kills a node of a cluster it starts: run it without --url")
    if sc.faults or sc.kill_replica_at_s is not None or sc.probes:
        raise SetupError(
            f"scenario {sc.name} injects faults or compares with a fault-free deployment at deploy "
            f"time: run it without --url"
        )
    if sc.kv_blocks or sc.max_num_seqs:
        log.info("the scenario's engine settings (KV pool size) apply to local deployments only")


def without_refused_depths(sc: Scenario, outputs: Outputs, patches_off: str | None) -> tuple[Scenario, Outputs]:
    """With the ``fuzz_layer`` patch off (and ``fuzz`` on) a deployment refuses every ``fuzz_layer`` but 0 with a
    400: the mix sends none (``deep`` 0) and the sweep stays at the embeddings. With ``fuzz`` off too every fuzz
    key is ignored (stock vLLM), and the mix is left as it is."""
    if not is_off("fuzz_layer", patches_off) or is_off("fuzz", patches_off):
        return sc, outputs
    sc = sc.model_copy(update={"mix": sc.mix.model_copy(update={"deep": 0.0})})
    return sc, outputs.model_copy(update={"fuzz_sweep_layers": (0,)})


def repeat_run(sc: Scenario, run_config: RunConfig, k: int) -> tuple[Scenario, RunConfig]:
    """The ``k``-th of ``repeat`` runs: its own seed (seed + k), and with a prompts file its own slice of it, so
    that no run sends another's requests again (a repeat would hit the caches the first one filled)."""
    if k == 0:
        return sc, run_config
    if sc.mix.prompts_file is not None:
        assert sc.profile.max_requests is not None, "a prompts file is sent with a fixed number of requests per run"
        sc = sc.model_copy(
            update={
                "mix": sc.mix.model_copy(update={"prompts_offset": sc.mix.prompts_offset + k * sc.profile.max_requests})
            }
        )
    return sc, run_config.model_copy(update={"seed": run_config.seed + k})


def run(
    sc: Scenario,
    target: RunTarget,
    run_config: RunConfig,
    settings: DeploySettings,
    outputs: Outputs,
    console: Console | None = None,
) -> RunSummary:
    """Deploy (unless ``target.url``), run the scenario ``outputs.repeat`` times, judge, write the report to
    ``outputs.out``; the summary (with ``repeat`` > 1, the last run's carrying every run's figures)."""
    console = console or Console()
    check_target(sc, target)
    sc, outputs = without_refused_depths(sc, outputs, settings.patches_off)
    cluster = None
    ref = None
    try:
        if target.url is not None:
            load_target = LoadTarget(
                target.url.rstrip("/"), list(target.metrics_urls) or discover_metrics_urls(), target.api_key
            )
        else:
            if sc.probes:
                ref = reference(*probe_reference(sc, settings, outputs.out, console, target.api_key))
            cluster = deploy(sc, settings, outputs.out, console)
            load_target = LoadTarget(cluster.base_url, cluster.metrics_urls, target.api_key, cluster)
        console.print(
            f"[bold]{sc.name}[/]: {sc.description}\n  target {load_target.base_url}, profile "
            f"{profile_shown(sc)}, metrics from {len(load_target.metrics_urls)} endpoint(s)"
            + (f", {outputs.repeat} runs" if outputs.repeat > 1 else "")
        )
        runs = [
            one_run(load_target, *repeat_run(sc, run_config, k), settings, ref, outputs.slo_attainment)
            for k in range(outputs.repeat)
        ]
        sweep = None
        if outputs.fuzz_sweep_per_task:
            sweep = http_sweep(load_target, outputs.fuzz_sweep_per_task, console, outputs.fuzz_sweep_layers)
    finally:
        if cluster is not None:
            with console.status("shutting the cluster down"):
                cluster.close(graceful=False)  # the run is judged: nothing to drain
    return report(runs, outputs, sweep)


def profile_shown(sc: Scenario) -> dict:
    """The profile's fields that apply to its kind (what the console shows)."""
    unused = (
        {"duration_s", "max_requests", "ramp_s", "rate"}
        if sc.profile.kind == "sweep"
        else {"step_s"} | ({"ramp_s"} if sc.profile.kind != "ramp" else set())
    )
    return sc.profile.model_dump(exclude_none=True, exclude=unused)


def one_run(
    target: LoadTarget,
    sc: Scenario,
    run_config: RunConfig,
    settings: DeploySettings,
    ref: ProbeReference | None,
    slo_attainment: float = 0.95,
) -> tuple[LoadRun, RunSummary]:
    """One run of the scenario's profile at ``target``: its :class:`~load_tests.runner.loop.LoadRun` and summary."""
    driver = None
    if sc.profile.kind == "sweep":
        driver = SweepDriver(SweepPlan.from_profile(sc.profile, slo_attainment=slo_attainment), sc.slo, run_config.seed)
    loaded = asyncio.run(run_load(target, sc, run_config, time.monotonic(), driver))
    fault_checks = check_planned_faults(
        sc.planned_faults,
        loaded.checker,
        loaded.events,
        not is_off("accounting", settings.patches_off),
        forced_kills(getattr(target.cluster, "session_dir", None)) if sc.operations else [],
        target.listed_dead,
    )
    deaths = unexpected_deaths(loaded.checker, loaded.events, target.listed_dead)
    probes = probe_verdict(ref, loaded.results) if sc.probes and ref is not None else None
    hostile = (
        judge_hostile(sc.hostile, loaded.results, loaded.connections, loaded.windows, sc.slo) if sc.hostile else None
    )
    summary = summarize(
        loaded.results,
        loaded.started,
        loaded.checker,
        loaded.events,
        loaded.wall_s,
        sc.slo,
        deaths,
        fault_checks,
        operator_ok=loaded.operator_ok,
        probes=probes,
        hostile=hostile,
        cost=loaded.cost,
    )
    summary.scenario = sc
    summary.patches_off = settings.patches_off
    if driver is not None:
        summary.capacity = driver.result()
    return loaded, summary


def http_sweep(target: LoadTarget, per_task: int, console: Console, layers: tuple[int, ...] = (0,)) -> list[SweepPoint]:
    with console.status(f"fuzz sweep through the deployment (fuzz_layer {', '.join(map(str, layers))})"):
        points = run_sweep(http_generator(target.base_url, target.api_key), held_out_examples(per_task), layers=layers)
    print_table(points)
    return points


def report(runs: list[tuple[LoadRun, RunSummary]], outputs: Outputs, sweep: list[SweepPoint] | None) -> RunSummary:
    """Write each run's report (with several, one directory each and a combined one) and return the summary."""
    out, title = outputs.out, outputs.title
    if len(runs) == 1:
        loaded, summary = runs[0]
        write_report(out, title, loaded.results, summary, loaded.checker, sweep)
        return summary
    dirs = [out / f"run-{k + 1}" for k in range(len(runs))]
    for d, (loaded, summary) in zip(dirs, runs, strict=False):
        write_report(d, f"{title}, run {d.name}", loaded.results, summary, loaded.checker)
    loaded, _ = runs[-1]
    summary = combined([s for _, s in runs], [str(d) for d in dirs])
    write_report(out, f"{title}, {len(runs)} runs", loaded.results, summary, loaded.checker, sweep)
    return summary
