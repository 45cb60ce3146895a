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
import json
import logging
import os
import sys
from pathlib import Path
from typing import NamedTuple

from rich.console import Console

from load_tests.command_logs import command_logging, log_to_file
from patches.framework.switches import OFF_ENV
from serve_app.engine.engine_env import use_engine_env
from serve_app.routing.routers import ROUTERS

from .errors import SetupError
from .load.fuzz_sweep import LAYERS, parse_layers
from .observe.monitor import SETTLE_INTERVAL_S
from .operate.deploy import DEFAULT_REPLICAS, DeploySettings
from .plan.scenarios import SCENARIOS, Scenario
from .plan.steps import Operation, Scale
from .plan.workload import file_prompts
from .report.console import print_summary
from .report.write import REPORT_FILES, RUN_LOG
from .results.models import EXIT_USAGE
from .runner.loop import RunConfig
from .runner.run import Outputs, RunTarget, run

log = logging.getLogger("fuzzserve.load_tests")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The CLI's options, one function per concern (the help lists them in the same groups)."""
    ap = argparse.ArgumentParser(
        prog="python -m load_tests", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="smoke",
        help="; ".join(f"{k}: {s.description}" for k, s in SCENARIOS.items()).replace("%", "%%"),
    )
    _target_args(ap)
    _deployment_args(ap)
    _load_args(ap)
    _operation_args(ap)
    _monitor_args(ap)
    _output_args(ap)
    return ap.parse_args(argv)


def _target_args(ap: argparse.ArgumentParser) -> None:
    """The options of where the load goes."""
    tgt = ap.add_argument_group("target (default: deploy locally)")
    tgt.add_argument("--url", help="base URL of a running deployment, e.g. http://127.0.0.1:8000")
    tgt.add_argument(
        "--api-key",
        default=None,
        help="API key (default: the first of FUZZSERVE_API_KEYS, which a local deploy also uses)",
    )
    tgt.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="a node's metrics endpoint (repeat per node); default: Ray's service discovery file",
    )
    tgt.add_argument("--allow-remote", action="store_true", help="allow a --url that is not on this machine")


def _deployment_args(ap: argparse.ArgumentParser) -> None:
    """The options of how a local deployment is made."""
    dep = ap.add_argument_group("local deployment")
    dep.add_argument("--config", type=Path, default=None, help="Serve config (default: serve_config.yaml)")
    dep.add_argument("--http-port", type=int, default=None, help="override the config's HTTP port")
    dep.add_argument("--patches-off", default=None, help=f"{OFF_ENV} for the cluster, for A/B runs (e.g. 'accounting')")
    dep.add_argument(
        "--replicas",
        type=_replicas,
        default=DEFAULT_REPLICAS,
        help=f"engine replicas (the config's engine_replicas; default {DEFAULT_REPLICAS}, so that the "
        "request router and per-replica checks have several replicas to work on; 'fit': the "
        "config's own sizing in a cluster of the host's CPU count, as serve deploy on `ray start` gives: one "
        "replica per engine core + frontend core)",
    )
    dep.add_argument(
        "--routing",
        choices=tuple(ROUTERS),
        default=None,
        help="the engine replicas' request router (serve_app.routing.fuzz_router; default: the config's)",
    )


def _load_args(ap: argparse.ArgumentParser) -> None:
    """The options of what load is sent (overriding the scenario)."""
    load = ap.add_argument_group("load (overrides the scenario)")
    load.add_argument(
        "--profile",
        choices=("fixed", "ramp", "poisson", "sweep"),
        default=None,
        help="sweep: the capacity search (load_tests.judge.capacity), steps of --step-s seconds at 1, 2, "
        "4, ... in flight up to --concurrency; names the knee",
    )
    load.add_argument("--concurrency", type=int, default=None, help="in flight (sweep: the last step's)")
    load.add_argument("--step-s", type=float, default=None, help="sweep: seconds per step (default 30)")
    load.add_argument(
        "--slo",
        type=json.loads,
        default=None,
        help='JSON overriding the scenario\'s latency targets, e.g. \'{"ttft_s": 2, "tpot_s": 0.2}\' (null unsets one)',
    )
    load.add_argument(
        "--slo-attainment",
        type=float,
        default=0.95,
        help="sweep: share of a step's complete answers that must meet the SLO (default 0.95)",
    )
    load.add_argument(
        "--repeat",
        type=_positive,
        default=1,
        help="run the profile N times on the one deployment; report each figure's median and spread",
    )
    load.add_argument("--rate", type=float, default=None, help="poisson: requests per second")
    load.add_argument("--duration", type=float, default=None, help="seconds of load")
    load.add_argument("--requests", type=int, default=None, help="stop after this many requests")
    load.add_argument(
        "--mix",
        type=json.loads,
        default=None,
        help='JSON overriding request-mix shares, e.g. \'{"bad": 0.1, "cancel": 0.2}\'',
    )
    load.add_argument(
        "--seed", type=int, default=0, help="the request mix's draws (with --repeat, run k uses seed + k)"
    )
    load.add_argument(
        "--prompts-file",
        type=Path,
        default=None,
        help='send these prompts (a vLLM `custom` dataset JSONL file of {"prompt": ...}) in order, '
        "none twice, with the body vLLM's bench serve sends; needs --requests (and, with "
        "--repeat N, N x that many prompts: run k sends the k-th slice)",
    )
    load.add_argument("--kill-replica-at", type=float, default=None, help="SIGKILL one replica after N s (local only)")
    load.add_argument("--timeout", type=float, default=300.0, help="per-request timeout (s)")
    load.add_argument(
        "--ingress-retry",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="send a request Serve's HAProxy refused before any replica saw it again, after 0.5 and "
        "1 s, as the openai SDK does (default); --no-ingress-retry: the refusal is the request's "
        "outcome (a 5xx), as curl, vLLM's bench serve or GuideLLM see it",
    )
    load.add_argument(
        "--probes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="greedy probes under the load vs a fault-free deployment (local only; default: the "
        "scenario's, on for soak)",
    )
    load.add_argument("--probe-every", type=float, default=60.0, help="seconds between probe rounds under the load")


def _operation_args(ap: argparse.ArgumentParser) -> None:
    """The options of the operations a run performs beside the load."""
    ops = ap.add_argument_group("operations (redeploy, redeploy-lite, scale, node-loss)")
    ops.add_argument(
        "--redeploy-engine-kwargs",
        type=json.loads,
        default=None,
        help="JSON replacing the engine settings a redeploy changes, e.g. '{\"max_model_len\": 99999}' "
        "(new replicas that never become ready: the run must fail saying so)",
    )
    ops.add_argument(
        "--scale-to",
        type=lambda v: [int(n) for n in v.split(",")],
        default=None,
        metavar="N[,N...]",
        help="the replica counts of the scale steps instead of the scenario's (2 -> 4 -> 1 -> 2), e.g. "
        "16: more replicas than the cluster holds (the run must fail naming the step)",
    )
    ops.add_argument(
        "--converge-timeout",
        type=float,
        default=None,
        help="seconds a step may take to converge (default: the scenario's, 480)",
    )
    ops.add_argument(
        "--declare-lost-nodes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="tell the monitor which node a node loss killed (--no-declare-lost-nodes: the monitor "
        "must then fail the run on the lost endpoint)",
    )


def _monitor_args(ap: argparse.ArgumentParser) -> None:
    """The options of how the counters are watched."""
    mon = ap.add_argument_group("monitor")
    mon.add_argument("--scrape-interval", type=float, default=2.0, help="seconds between scrapes during the load")
    mon.add_argument(
        "--settle-interval",
        type=float,
        default=SETTLE_INTERVAL_S,
        help="seconds between the idle scrapes that must agree at quiescence; must exceed the "
        "cluster's metrics export interval (Ray: RAY_metrics_report_interval_ms, 10 s by default)",
    )
    mon.add_argument(
        "--settle-timeout",
        type=float,
        default=90.0,
        help="seconds to wait for quiescence before the final checks run anyway (not_quiescent)",
    )


def _output_args(ap: argparse.ArgumentParser) -> None:
    """The options of what a run writes."""
    out = ap.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None, help="report directory (default: out/<scenario>)")
    out.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the fuzz sweep through the deployment after the load (default: on, except smoke)",
    )
    out.add_argument("--sweep-per-task", type=int, default=15)
    out.add_argument(
        "--sweep-layers",
        type=parse_layers,
        default=LAYERS,
        help="the fuzz sweep's depths, fuzz_layer values (default: 0,1,-1: the input embeddings, after the first "
        "decoder layer, after the last)",
    )
    out.add_argument("--no-progress", action="store_true", help="no live progress bar")
    out.add_argument(
        "--record-metrics",
        type=Path,
        default=None,
        help="save what every node exported of the families monitoring/'s rules use, every 10 s of "
        "the run, to this JSON-lines file (input for promtool: testkit.monitoring.record)",
    )


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


def scenario_from(args: argparse.Namespace) -> Scenario:
    """The scenario the flags ask for: the named one with the load, SLO, fault and operation overrides."""
    sc = SCENARIOS[args.scenario]
    prof = sc.profile.model_dump()
    for key, val in (
        ("kind", args.profile),
        ("concurrency", args.concurrency),
        ("rate", args.rate),
        ("duration_s", args.duration),
        ("max_requests", args.requests),
        ("step_s", args.step_s),
    ):
        if val is not None:
            prof[key] = val
    if args.requests is not None and args.duration is None:
        prof["duration_s"] = None
    profile = type(sc.profile).model_validate(prof)
    mix = type(sc.mix).model_validate({**sc.mix.model_dump(), **args.mix}) if args.mix else sc.mix
    if args.prompts_file is not None:
        if profile.max_requests is None or profile.kind not in ("fixed", "poisson", "ramp"):
            raise ValueError("--prompts-file sends each prompt once: give --requests (a fixed number per run)")
        have, need = len(file_prompts(str(args.prompts_file))), profile.max_requests * args.repeat
        if have < need:
            raise ValueError(
                f"--prompts-file {args.prompts_file} has {have} prompts; {args.repeat} run(s) of "
                f"{profile.max_requests} requests need {need} (none is sent twice)"
            )
        mix = mix.model_copy(update={"prompts_file": str(args.prompts_file), "bench_body": True})
    slo = type(sc.slo).model_validate({**sc.slo.model_dump(), **args.slo}) if args.slo else sc.slo
    if profile.kind == "sweep" and (sc.kill_replica_at_s is not None or sc.probes):
        raise ValueError(
            f"scenario {sc.name} kills a replica or sends probes: a capacity search does neither "
            "(pick a scenario without, e.g. stress or bench)"
        )
    if args.repeat > 1 and sc.kill_replica_at_s is not None:
        raise ValueError("--repeat measures figures; a scenario that kills a replica is run once")
    kill_at = args.kill_replica_at if args.kill_replica_at is not None else sc.kill_replica_at_s
    operations = sc.operations
    if operations is not None:
        if profile.kind == "sweep" or args.repeat > 1:
            raise ValueError(f"scenario {sc.name} changes the deployment under the load: run it once, fixed load")
        steps = tuple(
            s.model_copy(update={"engine_kwargs": args.redeploy_engine_kwargs})
            if s.kind == "redeploy" and args.redeploy_engine_kwargs is not None
            else s
            for s in operations.steps
        )
        if args.scale_to is not None:
            steps = scale_steps(steps, args.scale_to, sc.name)
        operations = operations.model_copy(
            update={"steps": steps} | ({"converge_timeout_s": args.converge_timeout} if args.converge_timeout else {})
        )
    elif args.redeploy_engine_kwargs is not None or args.converge_timeout is not None or args.scale_to is not None:
        raise ValueError(
            f"scenario {sc.name} has no operations (--redeploy-engine-kwargs, --scale-to, --converge-timeout)"
        )
    probes = args.probes if args.probes is not None else sc.probes
    changed = sc.model_copy(
        update={
            "profile": profile,
            "mix": mix,
            "slo": slo,
            "kill_replica_at_s": kill_at,
            "operations": operations,
            "probes": probes,
        }
    )
    return changed.checked()  # a copy with fields replaced is not validated: the scenario's own check again


def scale_steps(steps: tuple[Operation, ...], counts: list[int], scenario: str) -> tuple[Operation, ...]:
    """``steps`` with its scale steps replaced by one per count (each waits as long as the one it replaces, or as
    the last one); refuses a scenario without scale steps and a count below 1."""
    scales = [s for s in steps if isinstance(s, Scale)]
    if not scales:
        raise ValueError(f"scenario {scenario} has no scale steps (--scale-to): use --scenario scale")
    if not counts or min(counts) < 1:
        raise ValueError(f"--scale-to wants replica counts of at least 1, got {counts}")
    new = [Scale(after_s=scales[min(i, len(scales) - 1)].after_s, replicas=n) for i, n in enumerate(counts)]
    return tuple(s for s in steps if not isinstance(s, Scale)) + tuple(new)


def run_config_from(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        seed=args.seed,
        request_timeout_s=args.timeout,
        progress=not args.no_progress,
        scrape_interval_s=args.scrape_interval,
        settle_interval_s=args.settle_interval,
        settle_timeout_s=args.settle_timeout,
        probe_every_s=args.probe_every,
        declare_lost_nodes=args.declare_lost_nodes,
        record_metrics=args.record_metrics,
        ingress_retry=args.ingress_retry,
    )


def deploy_settings_from(args: argparse.Namespace) -> DeploySettings:
    return DeploySettings(
        config=args.config,
        http_port=args.http_port,
        patches_off=args.patches_off,
        replicas=args.replicas,
        routing=args.routing,
    )


def target_from(args: argparse.Namespace) -> RunTarget:
    api_key = args.api_key or (os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None)
    return RunTarget(
        url=args.url, metrics_urls=tuple(args.metrics_url), api_key=api_key, allow_remote=args.allow_remote
    )


def outputs_from(args: argparse.Namespace, sc: Scenario) -> Outputs:
    out = args.out or Path("out") / sc.name
    if (
        args.record_metrics is not None
        and args.record_metrics.resolve().parent == out.resolve()
        and args.record_metrics.name in REPORT_FILES
    ):
        raise ValueError(f"--record-metrics {args.record_metrics}: the report writes that file; pick another name")
    # the fuzz sweep after the load: on by default, except for smoke and the capacity search (its own minutes)
    sweep_on = args.sweep if args.sweep is not None else (sc.name != "smoke" and sc.profile.kind != "sweep")
    title = f"Load test: {sc.name}" + (f" (patches off: {args.patches_off})" if args.patches_off else "")
    return Outputs(
        out=out,
        title=title,
        repeat=args.repeat,
        fuzz_sweep_per_task=args.sweep_per_task if sweep_on else None,
        fuzz_sweep_layers=args.sweep_layers,
        slo_attainment=args.slo_attainment,
    )


class RunInputs(NamedTuple):
    """What :func:`~load_tests.runner.run.run` takes, in its order: ``run(*inputs, console)``."""

    scenario: Scenario
    target: RunTarget
    run_config: RunConfig
    settings: DeploySettings
    outputs: Outputs


def inputs_from(args: argparse.Namespace) -> RunInputs:
    """The typed inputs of a load run that parsed flags ask for (ValueError: settings that do not fit together)."""
    sc = scenario_from(args)
    run_config, settings = run_config_from(args), deploy_settings_from(args)
    return RunInputs(sc, target_from(args), run_config, settings, outputs_from(args, sc))


def inputs_for(argv: list[str]) -> RunInputs:
    """The inputs ``python -m load_tests <argv>`` would run with, for a caller that runs them in its own process.

    In-process callers (``benchmarks.bench_agreement``, ``testkit.monitoring``) describe their run with the CLI's
    flags so that it is the run a user gets from the same command line: one parser, one set of defaults."""
    return inputs_from(parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command_logging()
    use_engine_env()
    # soft wrap: a line longer than the terminal is the terminal's to wrap (a log file or pipe gets it whole)
    console = Console(soft_wrap=True)
    try:
        inputs = inputs_from(args)
    except ValueError as e:
        console.print(f"[red]bad load settings[/]: {e}")
        return EXIT_USAGE
    log_to_file(inputs.outputs.out / RUN_LOG)
    try:
        summary = run(*inputs, console)
    except SetupError as e:
        console.print(f"[red]cannot run {inputs.scenario.name}[/]: {e}")
        return EXIT_USAGE
    print_summary(console, summary, inputs.outputs.out / "report.md")
    return summary.exit_code


if __name__ == "__main__":
    sys.exit(main())
