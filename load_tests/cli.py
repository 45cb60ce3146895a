"""The stress-test CLI: drive a fuzz load, watch every replica's counters, report, exit non-zero on any problem.

    python -m load_tests --scenario smoke|stress|chaos [options]

Without ``--url`` it deploys the app itself: a local Ray cluster (``ray
start``), ``serve deploy`` of ``--config`` (with the scenario's faults), the
run, a fuzz sweep through the deployment, teardown. With ``--url`` it drives an
existing deployment (metrics from ``--metrics-url`` or Ray's service
discovery file); only addresses on this machine unless ``--allow-remote``.

Exit code (``load_tests.results``): 0 when the run passed; 1 on any
invariant violation, lost request, unexpected error, client/server mismatch,
unreadable metrics endpoint, unplanned replica death or planned fault that
did not fire (``RunSummary.failures``: report.md and summary.json say
which); 2 on a usage or set-up error.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from patches.switches import OFF_ENV, is_off
from serve_app.command_logs import command_logging
from serve_app.engine_env import use_engine_env
from serve_app.routers import ROUTERS

from .deploy import DEFAULT_REPLICAS, DeploySettings, deploy, probe_reference
from .monitor import SETTLE_INTERVAL_S

if TYPE_CHECKING:
    from .load_loop import LoadRun, RunConfig
    from .scenarios import Scenario
    from .results import RunSummary
    from .target import LoadTarget

log = logging.getLogger("fuzzserve.load_tests")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from .scenarios import SCENARIOS

    ap = argparse.ArgumentParser(prog="python -m load_tests", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="smoke",
                    help="; ".join(f"{k}: {s.description}" for k, s in SCENARIOS.items()))
    tgt = ap.add_argument_group("target (default: deploy locally)")
    tgt.add_argument("--url", help="base URL of a running deployment, e.g. http://127.0.0.1:8000")
    tgt.add_argument("--api-key", default=None,
                     help="API key (default: the first of FUZZSERVE_API_KEYS, which a local deploy also uses)")
    tgt.add_argument("--metrics-url", action="append", default=[],
                     help="a node's metrics endpoint (repeat per node); default: Ray's service discovery file")
    tgt.add_argument("--allow-remote", action="store_true", help="allow a --url that is not on this machine")
    dep = ap.add_argument_group("local deployment")
    dep.add_argument("--config", type=Path, default=None, help="Serve config (default: serve_config.yaml)")
    dep.add_argument("--http-port", type=int, default=None, help="override the config's HTTP port")
    dep.add_argument("--patches-off", default=None,
                     help=f"{OFF_ENV} for the cluster, for A/B runs (e.g. 'accounting')")
    dep.add_argument("--replicas", type=_replicas, default=DEFAULT_REPLICAS,
                     help=f"engine replicas (the config's engine_replicas; default {DEFAULT_REPLICAS}, so that the "
                          "request router and per-replica checks have several replicas to work on; 'fit': the "
                          "config's own sizing in a cluster of the host's CPU count, as serve deploy on `ray start` gives: one "
                          "replica per engine core + frontend core)")
    dep.add_argument("--routing", choices=tuple(ROUTERS), default=None,
                     help="the engine replicas' request router (serve_app.routing; default: the config's)")
    load = ap.add_argument_group("load (overrides the scenario)")
    load.add_argument("--profile", choices=("fixed", "ramp", "poisson", "sweep"), default=None,
                      help="sweep: the capacity search (load_tests.capacity), steps of --step-s seconds at 1, 2, "
                           "4, ... in flight up to --concurrency; names the knee")
    load.add_argument("--concurrency", type=int, default=None, help="in flight (sweep: the last step's)")
    load.add_argument("--step-s", type=float, default=None, help="sweep: seconds per step (default 30)")
    load.add_argument("--slo", type=json.loads, default=None,
                      help='JSON overriding the scenario\'s latency targets, e.g. \'{"ttft_s": 2, "tpot_s": 0.2}\' '
                           "(null unsets one)")
    load.add_argument("--slo-attainment", type=float, default=0.95,
                      help="sweep: share of a step's complete answers that must meet the SLO (default 0.95)")
    load.add_argument("--repeat", type=_positive, default=1,
                      help="run the profile N times on the one deployment; report each figure's median and spread")
    load.add_argument("--rate", type=float, default=None, help="poisson: requests per second")
    load.add_argument("--duration", type=float, default=None, help="seconds of load")
    load.add_argument("--requests", type=int, default=None, help="stop after this many requests")
    load.add_argument("--mix", type=json.loads, default=None,
                      help='JSON overriding request-mix shares, e.g. \'{"bad": 0.1, "cancel": 0.2}\'')
    load.add_argument("--seed", type=int, default=0, help="the request mix's draws (with --repeat, run k uses seed + k)")
    load.add_argument("--prompts-file", type=Path, default=None,
                      help="send these prompts (a vLLM `custom` dataset JSONL file of {\"prompt\": ...}) in order, "
                           "none twice, with the body vLLM's bench serve sends; needs --requests (and, with "
                           "--repeat N, N x that many prompts: run k sends the k-th slice)")
    load.add_argument("--kill-replica-at", type=float, default=None, help="SIGKILL one replica after N s (local only)")
    load.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    load.add_argument("--probes", action=argparse.BooleanOptionalAction, default=None,
                      help="greedy probes under the load vs a fault-free deployment (local only; default: the "
                           "scenario's, on for soak)")
    load.add_argument("--probe-every", type=float, default=60.0, help="seconds between probe rounds under the load")
    ops = ap.add_argument_group("operations (redeploy, redeploy-lite, scale, node-loss)")
    ops.add_argument("--redeploy-engine-kwargs", type=json.loads, default=None,
                     help='JSON replacing the engine settings a redeploy changes, e.g. \'{"max_model_len": 99999}\' '
                          "(new replicas that never become ready: the run must fail saying so)")
    ops.add_argument("--scale-to", type=lambda v: [int(n) for n in v.split(",")], default=None, metavar="N[,N...]",
                     help="the replica counts of the scale steps instead of the scenario's (2 -> 4 -> 1 -> 2), e.g. "
                          "16: more replicas than the cluster holds (the run must fail naming the step)")
    ops.add_argument("--converge-timeout", type=float, default=None,
                     help="seconds a step may take to converge (default: the scenario's, 480)")
    ops.add_argument("--declare-lost-nodes", action=argparse.BooleanOptionalAction, default=True,
                     help="tell the monitor which node a node loss killed (--no-declare-lost-nodes: the monitor "
                          "must then fail the run on the lost endpoint)")
    mon = ap.add_argument_group("monitor")
    mon.add_argument("--scrape-interval", type=float, default=2.0, help="seconds between scrapes during the load")
    mon.add_argument("--settle-interval", type=float, default=SETTLE_INTERVAL_S,
                     help="seconds between the idle scrapes that must agree at quiescence; must exceed the "
                          "cluster's metrics export interval (Ray: RAY_metrics_report_interval_ms, 10 s by default)")
    mon.add_argument("--settle-timeout", type=float, default=90.0,
                     help="seconds to wait for quiescence before the final checks run anyway (not_quiescent)")
    out = ap.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None, help="report directory (default: out/<scenario>)")
    out.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=None,
                     help="run the fuzz sweep through the deployment after the load (default: on, except smoke)")
    out.add_argument("--sweep-per-task", type=int, default=15)
    out.add_argument("--no-progress", action="store_true", help="no live progress bar")
    out.add_argument("--record-metrics", type=Path, default=None,
                     help="save what every node exported of the families monitoring/'s rules use, every 10 s of "
                          "the run, to this JSON-lines file (input for promtool: testkit.monitoring.record)")
    return ap.parse_args(argv)


def _unused(profile) -> set[str]:
    """The profile's fields that do not apply to its kind (left out of what the CLI prints)."""
    return {"duration_s", "max_requests", "ramp_s", "rate"} if profile.kind == "sweep" else \
        {"step_s"} | ({"ramp_s"} if profile.kind != "ramp" else set())


def _positive(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return n


def _replicas(value: str) -> int | str:
    if value == "fit":
        return value
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"--replicas must be >= 1 or 'fit', got {value}")
    return n


def scenario_from(args: argparse.Namespace):
    from .scenarios import SCENARIOS

    sc = SCENARIOS[args.scenario].model_copy(deep=True)
    prof = sc.profile.model_dump()
    for key, val in (("kind", args.profile), ("concurrency", args.concurrency), ("rate", args.rate),
                     ("duration_s", args.duration), ("max_requests", args.requests), ("step_s", args.step_s)):
        if val is not None:
            prof[key] = val
    if args.requests is not None and args.duration is None:
        prof["duration_s"] = None
    sc.profile = type(sc.profile).model_validate(prof)
    if args.mix:
        sc.mix = type(sc.mix).model_validate({**sc.mix.model_dump(), **args.mix})
    if args.prompts_file is not None:
        from .workload import file_prompts

        if sc.profile.max_requests is None or sc.profile.kind not in ("fixed", "poisson", "ramp"):
            raise ValueError("--prompts-file sends each prompt once: give --requests (a fixed number per run)")
        have, need = len(file_prompts(str(args.prompts_file))), sc.profile.max_requests * args.repeat
        if have < need:
            raise ValueError(f"--prompts-file {args.prompts_file} has {have} prompts; {args.repeat} run(s) of "
                             f"{sc.profile.max_requests} requests need {need} (none is sent twice)")
        sc.mix = sc.mix.model_copy(update={"prompts_file": str(args.prompts_file), "bench_body": True})
    if args.slo:
        sc.slo = type(sc.slo).model_validate({**sc.slo.model_dump(), **args.slo})
    if sc.profile.kind == "sweep" and (sc.kill_replica_at_s is not None or sc.probes):
        raise ValueError(f"scenario {sc.name} kills a replica or sends probes: a capacity search does neither "
                         "(pick a scenario without, e.g. stress or bench)")
    if args.repeat > 1 and sc.kill_replica_at_s is not None:
        raise ValueError("--repeat measures figures; a scenario that kills a replica is run once")
    if args.kill_replica_at is not None:
        sc.kill_replica_at_s = args.kill_replica_at
    if sc.operations is not None:
        if sc.profile.kind == "sweep" or args.repeat > 1:
            raise ValueError(f"scenario {sc.name} changes the deployment under the load: run it once, fixed load")
        steps = tuple(s.model_copy(update={"engine_kwargs": args.redeploy_engine_kwargs})
                      if s.kind == "redeploy" and args.redeploy_engine_kwargs is not None else s
                      for s in sc.operations.steps)
        if args.scale_to is not None:
            steps = scale_steps(steps, args.scale_to, sc.name)
        sc.operations = sc.operations.model_copy(update={"steps": steps} | (
            {"converge_timeout_s": args.converge_timeout} if args.converge_timeout else {}))
    elif args.redeploy_engine_kwargs is not None or args.converge_timeout is not None or args.scale_to is not None:
        raise ValueError(f"scenario {sc.name} has no operations (--redeploy-engine-kwargs, --scale-to, "
                         "--converge-timeout)")
    if args.probes is not None:
        sc.probes = args.probes
    return sc


def scale_steps(steps: tuple, counts: list[int], scenario: str) -> tuple:
    """``steps`` with its scale steps replaced by one per count (each waits as long as the one it replaces, or as
    the last one); refuses a scenario without scale steps and a count below 1."""
    from .operations import Scale

    scales = [s for s in steps if isinstance(s, Scale)]
    if not scales:
        raise ValueError(f"scenario {scenario} has no scale steps (--scale-to): use --scenario scale")
    if not counts or min(counts) < 1:
        raise ValueError(f"--scale-to wants replica counts of at least 1, got {counts}")
    new = [Scale(after_s=scales[min(i, len(scales) - 1)].after_s, replicas=n) for i, n in enumerate(counts)]
    return tuple(s for s in steps if not isinstance(s, Scale)) + tuple(new)


def is_local(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    local = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None)} | {"127.0.0.1", "::1"}
    return all(ipaddress.ip_address(a).is_loopback or a in local for a in addrs)


def run_config_from(args: argparse.Namespace) -> RunConfig:
    from .load_loop import RunConfig

    return RunConfig(seed=args.seed, request_timeout_s=args.timeout, progress=not args.no_progress,
                     scrape_interval_s=args.scrape_interval, settle_interval_s=args.settle_interval,
                     settle_timeout_s=args.settle_timeout, probe_every_s=args.probe_every,
                     declare_lost_nodes=args.declare_lost_nodes, record_metrics=args.record_metrics)


def deploy_settings_from(args: argparse.Namespace) -> DeploySettings:
    return DeploySettings(config=args.config, http_port=args.http_port, patches_off=args.patches_off,
                          replicas=args.replicas, routing=args.routing)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command_logging()
    use_engine_env()
    from rich.console import Console

    from .report import REPORT_FILES, write_report
    from .results import EXIT_USAGE
    from .target import LoadTarget

    console = Console()
    try:
        sc = scenario_from(args)
        run_config = run_config_from(args)
        settings = deploy_settings_from(args)
    except ValueError as e:
        console.print(f"[red]bad load settings[/]: {e}")
        return EXIT_USAGE
    out = args.out or Path("out") / sc.name
    if args.record_metrics is not None and args.record_metrics.resolve().parent == out.resolve() \
            and args.record_metrics.name in REPORT_FILES:
        console.print(f"[red]--record-metrics {args.record_metrics}[/]: the report writes that file; pick another name")
        return EXIT_USAGE
    # the fuzz sweep after the load: on by default, except for smoke and the capacity search (its own minutes)
    sweep_on = args.sweep if args.sweep is not None else (sc.name != "smoke" and sc.profile.kind != "sweep")
    api_key = args.api_key or (os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None)

    cluster = None
    reference = None
    try:
        if args.url:
            if not args.allow_remote and not is_local(args.url):
                console.print(f"[red]{args.url} is not on this machine[/]; pass --allow-remote to load it anyway")
                return EXIT_USAGE
            if sc.operations and "node_loss" in sc.operations.kinds or sc.cluster:
                console.print(f"[red]scenario {sc.name} kills a node of a cluster it starts[/]: run it without --url")
                return EXIT_USAGE
            if sc.faults or sc.kill_replica_at_s is not None or sc.probes:
                console.print(f"[red]scenario {sc.name} injects faults or compares with a fault-free deployment "
                              f"at deploy time[/]: run it without --url")
                return EXIT_USAGE
            if sc.kv_blocks or sc.max_num_seqs:
                log.info("the scenario's engine settings (KV pool size) apply to local deployments only")
            from .scraper import discover_metrics_urls

            target = LoadTarget(args.url.rstrip("/"), args.metrics_url or discover_metrics_urls(), api_key)
        else:
            if sc.probes:
                reference = probe_reference(sc, settings, out, console, api_key)
            cluster = deploy(sc, settings, out, console)
            target = LoadTarget(cluster.base_url, cluster.metrics_urls, api_key, cluster)

        profile = sc.profile.model_dump(exclude_none=True, exclude=_unused(sc.profile))
        console.print(f"[bold]{sc.name}[/]: {sc.description}\n  target {target.base_url}, profile {profile}, "
                      f"metrics from {len(target.metrics_urls)} endpoint(s)"
                      + (f", {args.repeat} runs" if args.repeat > 1 else ""))
        runs = [one_run(target, *repeat_run(sc, run_config, k), settings, args, reference)
                for k in range(args.repeat)]
        sweep = None
        if sweep_on:
            sweep = run_http_sweep(target, args.sweep_per_task, console)
    finally:
        if cluster is not None:
            with console.status("shutting the cluster down"):
                cluster.close()
    title = f"Load test: {sc.name}" + (f" (patches off: {args.patches_off})" if args.patches_off else "")
    if len(runs) == 1:
        run, summary = runs[0]
        path = write_report(out, title, run.results, summary, run.checker, sweep)
    else:
        from .repeats import combined

        dirs = [out / f"run-{k + 1}" for k in range(len(runs))]
        for d, (run, summary) in zip(dirs, runs):
            write_report(d, f"{title}, run {d.name}", run.results, summary, run.checker)
        run, _ = runs[-1]
        summary = combined([s for _, s in runs], [str(d) for d in dirs])
        path = write_report(out, f"{title}, {len(runs)} runs", run.results, summary, run.checker, sweep)
    print_summary(console, summary, path)
    return summary.exit_code


def repeat_run(sc: Scenario, run_config: RunConfig, k: int) -> tuple[Scenario, RunConfig]:
    """The ``k``-th of ``--repeat`` runs: its own seed (seed + k), and with a prompts file its own slice of it, so
    that no run sends another's requests again (a repeat would hit the caches the first one filled)."""
    if k == 0:
        return sc, run_config
    if sc.mix.prompts_file is not None:
        sc = sc.model_copy(update={"mix": sc.mix.model_copy(update={
            "prompts_offset": sc.mix.prompts_offset + k * sc.profile.max_requests})})
    return sc, run_config.model_copy(update={"seed": run_config.seed + k})


def one_run(target: LoadTarget, sc: Scenario, run_config: RunConfig, settings: DeploySettings,
            args: argparse.Namespace, reference) -> tuple[LoadRun, RunSummary]:
    """One run of the scenario's profile at ``target``: its :class:`~load_tests.load_loop.LoadRun` and summary."""
    from .capacity import SweepDriver
    from .fault_evidence import check_planned_faults
    from .load_loop import run_load
    from .profiles import SweepPlan
    from .summary import summarize, unexpected_deaths

    driver = None
    if sc.profile.kind == "sweep":
        driver = SweepDriver(SweepPlan.from_profile(sc.profile, slo_attainment=args.slo_attainment), sc.slo,
                             run_config.seed)
    t0 = time.monotonic()
    run = asyncio.run(run_load(target, sc, run_config, t0, driver))
    from .operations import forced_kills

    fault_checks = check_planned_faults(sc.planned_faults, run.checker, run.faults,
                                        not is_off("accounting", settings.patches_off),
                                        forced_kills(getattr(target.cluster, "session_dir", None))
                                        if sc.operations else [], target.listed_dead)
    deaths = unexpected_deaths(run.checker, run.faults, target.listed_dead)
    summary = summarize(run.results, run.started, run.checker, run.faults, run.wall_s, sc.slo, deaths, fault_checks,
                        operator_ok=run.operator_ok)
    summary.scenario = sc
    summary.patches_off = args.patches_off
    if driver is not None:
        summary.capacity = driver.result()
    if sc.probes:
        add_probe_verdict(summary, reference, run.results)
    return run, summary


def add_probe_verdict(summary: RunSummary, reference, results) -> None:
    from .probes import answers, compare

    verdict = compare(reference["answers"], answers(results))
    verdict.problems = reference["problems"] + verdict.problems
    verdict.reference = reference["answers"]
    summary.probes = verdict
    summary.failures.extend(f"probes: {p}" for p in verdict.problems)


def run_http_sweep(target: LoadTarget, per_task: int, console):
    from fixture_model.tasks import held_out_examples

    from .fuzz_sweep import http_generator, print_table, run_sweep

    with console.status("fuzz sweep through the deployment"):
        points = run_sweep(http_generator(target.base_url, target.api_key), held_out_examples(per_task))
    print_table(points)
    return points


def print_summary(console, summary: RunSummary, path: Path) -> None:
    from rich.table import Table

    from .report import ingress_retries_line

    name = summary.scenario.name if summary.scenario else "load test"
    t = Table(title=f"{name}: {'PASSED' if summary.passed else 'FAILED'}")
    t.add_column("")
    t.add_column("")
    t.add_row("requests", f"{summary.started} started; " + ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())))
    tp = summary.throughput
    t.add_row("throughput", f"{tp.requests_per_s:.2f} req/s ({tp.completed} complete), "
                            f"{tp.output_tokens_per_s:.0f} tok/s")
    t.add_row("goodput", f"{tp.goodput_requests_per_s:.2f} req/s ({tp.slo_met} of {tp.completed} met "
                         f"{summary.slo.model_dump(exclude_none=True)})")
    for name, p in summary.latency_s:
        t.add_row(f"{name.upper()} p50 / p99", " / ".join("-" if v is None else f"{v * 1000:.0f} ms"
                                                          for v in (p.p50, p.p99)) + f" ({p.requests} requests)")
    inv = summary.invariants
    if summary.ingress_retries.requests:
        t.add_row("ingress retries", ingress_retries_line(summary))
    t.add_row("invariants", f"{inv.scrapes} scrapes, {inv.violations} violations {inv.by_kind or ''}")
    left = {k for c in summary.planned_faults for k in c.per_replica.get("departures", {})}
    t.add_row("replicas", ", ".join(k + (" (left as planned)" if r.stale and k in left else " (dead)" if r.stale else "")
                                    for k, r in summary.replicas.items()))
    if summary.capacity:
        cap = summary.capacity
        t.add_row("capacity", ", ".join(f"{st.concurrency}: {st.throughput.goodput_requests_per_s:.1f}"
                                        + ("" if st.meets_slo else " (misses SLO)") for st in cap.steps)
                  + " req/s goodput by requests in flight")
        t.add_row("knee", "none met the SLO" if cap.knee is None else
                  f"{cap.knee} in flight, {cap.knee_goodput_requests_per_s:.2f} req/s goodput; stopped: "
                  f"{cap.stopped_because}")
    if summary.repeats:
        for name in ("requests_per_s", "goodput_requests_per_s", "ttft_p99_s", "knee_concurrency"):
            if (sp := summary.repeats.figures.get(name)) is not None:
                t.add_row(f"{name} over {summary.repeats.runs} runs",
                          f"median {sp.median:.3g}, {sp.min:.3g} to {sp.max:.3g} ({sp.relative_spread or 0:.0%} spread)")
    for c in summary.planned_faults:
        t.add_row(f"fault {c.fault}", ("[green]fired[/]" if c.ok else "[red]not shown[/]") + f": {c.evidence}")
    for reason in summary.failures:
        t.add_row("[red]failure[/]", reason)
    console.print(t)
    console.print(f"report: {path}")


if __name__ == "__main__":
    sys.exit(main())
