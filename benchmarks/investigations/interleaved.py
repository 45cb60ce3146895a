r"""Levers on the Serve arms, measured interleaved in one cluster, so that the host's own drift cancels.

    python -m benchmarks.investigations.interleaved --arms shipped,shipped+FUZZSERVE_AA=1        # the A/A control
    python -m benchmarks.investigations.interleaved --arms shipped,shipped+NAME=VALUE,stock --rounds 8

Why: on this machine kind the host's speed moves 1.3-1.5x for minutes at a
time (docs/benchmarks.md, "The measurement itself"), and ``benchmarks.vs_vllm``
starts every arm fresh (a cluster of its own, a few minutes per phase), so a
pair's two phases can meet different speeds and a lever worth 5-10 % reads
as noise. Here every arm is an application of **one** Ray cluster, each with
its own engine replica behind Serve's HAProxy at a route of its own; the
arms then take turns, a short run each (``--requests``), ABC then CBA
(:func:`benchmarks.harness.pair_stats.block_order`), so the two runs of a
round are seconds apart. A round is what ``vs_vllm`` calls a pair: each arm
gets the round's prompts (a cold set of its own per round; the arms' engines
share no cache), its own warm-up first, the same ``vllm bench serve`` client
(:func:`benchmarks.harness.phase.run_phase`), and the same report and ratios
(:func:`benchmarks.harness.comparison.compare`), against the first arm.

What an arm may be: ``shipped`` (the config's application), a variant
``shipped+NAME=VALUE`` (the variables in that application's
``runtime_env``, so they reach its replica and engine processes, not the
rest of the cluster), ``shipped+config=PATH`` (the application of another
config), and ``stock`` (stock ``ray.serve.llm``, as ``vs_vllm`` builds it).
Cluster-wide levers (``ray start``'s environment, ``pin=``, ``via=``) and
the non-Ray arms (plain vLLM must be alone on the host) stay with
``vs_vllm``. Every engine replica is its deployment's rank 0, so every
engine is pinned to the same core, as in ``vs_vllm``; the idle arms' engines
wait (they hold their memory, a few GiB each) and the report's CPU per role
sums the replicas of a role over every arm. A run with any failed request, a
stall or any cache hit (read cluster-wide: only one arm runs at a time) is
void, as in ``vs_vllm``.

The harness's own control is the A/A run (a variable nothing reads): its
ratios must sit at 1.00x; docs/benchmarks.md gives the figures. Results:
``vs_vllm.json``, ``vs_vllm.md`` and ``vs_vllm.png`` in ``--out``, in
``vs_vllm``'s format. A benchmark, not a test: it asserts no target
(tests/test_interleaved.py checks how the cluster's config is built).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from benchmarks.harness import client_priority, pair_stats
from benchmarks.harness.arms import (
    ARM_OPTIONS,
    ProtocolError,
    load_config,
    parse_arm,
    require_no_ray,
    slug,
    split_arms,
    stock_config,
)
from benchmarks.harness.comparison import compare
from benchmarks.harness.host import HostCpuSampler, lingering_engines, machine, ray_processes
from benchmarks.harness.phase import run_phase
from benchmarks.harness.prompts import PromptSet
from benchmarks.harness.report import markdown, plot, write_results
from benchmarks.harness.runs import Meta, Run
from benchmarks.harness.server_counters import read_counters
from benchmarks.harness.stopping import stop_on_term
from benchmarks.harness.workload import Workload, local_pool_tokens, parse_requests, prompt_plan
from benchmarks.vs_vllm import REPO
from load_tests.command_logs import command_logging
from serve_app.config import deploy_config
from serve_app.config.deploy_config import Application, ServeConfig
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.interleaved")

DEFAULT_OUT = REPO / "out" / "interleaved"
BASES = ("shipped", "stock")  # the arms that are a Serve application
# Between two runs: the arm just measured settles (stock's engine polls its worker for a while after its last step).
SETTLE_S = 3.0
# Logical CPUs the cluster advertises: every arm's replica must be placed on the one node whatever it asks for
# (the engines' cores are pinned by the app, not by Ray's accounting).
CPUS_PER_ARM = 4


@dataclass
class AppArm:
    """One arm as an application of the shared cluster: what :func:`benchmarks.harness.phase.run_phase` needs."""

    name: str
    app: str
    route_prefix: str
    ours: bool  # our application (ready when /ready answers) or stock's (when /v1/models does)
    base_url: str = ""
    metrics_urls: list[str] = field(default_factory=list)
    replicas: int = 1

    def check(self, when: str) -> None:
        """Nothing to check per run: the cluster is shared and stays up (vs_vllm's Serve arms check nothing)."""


def route_for(index: int) -> str:
    """The first arm at ``/`` (as shipped), the others at ``/arm<i>``."""
    return "/" if index == 0 else f"/arm{index}"


def app_for(arm: str, index: int, config: ServeConfig, model: Path) -> tuple[Application, bool]:
    """The Serve application of ``arm`` (one engine replica, at :func:`route_for`), and whether it is ours."""
    base, extra = parse_arm(arm)
    if base not in BASES:
        raise ValueError(f"arm {arm!r}: only {', '.join(BASES)} and their variants are applications of a cluster")
    if "config" in extra:
        config = load_config(Path(extra.pop("config")))
    options = sorted(k for k in extra if k in ARM_OPTIONS)
    if options:
        raise ValueError(f"arm {arm!r}: {', '.join(options)} act on the whole cluster; measure it with vs_vllm")
    name = f"arm{index}-{slug(base)}"
    if base == "stock":
        cfg = stock_config(config, model)
    else:
        cfg = deploy_config.with_builder_args(config, {"engine_replicas": 1})
    cfg = deploy_config.with_env(cfg, extra)
    (app,) = cfg.applications
    return deploy_config.renamed(app, name, route_for(index)), base != "stock"


def cluster_config(arms: list[str], config: ServeConfig, model: Path) -> tuple[ServeConfig, list[AppArm]]:
    """One config holding every arm's application, and the arms as :class:`AppArm` (URLs set once deployed)."""
    apps, out = [], []
    for i, arm in enumerate(arms):
        app, ours = app_for(arm, i, config, model)
        apps.append(app)
        out.append(AppArm(arm, app.name, route_for(i), ours))
    return deploy_config.with_applications(config, apps), out


def url(base: str, route_prefix: str, path: str) -> str:
    return base + route_prefix.rstrip("/") + path


def wait_ready(arms: list[AppArm], timeout: float = 900) -> None:
    """Until every arm answers at its route (``base_url``): ours ``/ready``, stock's ``/v1/models``."""
    deadline = time.monotonic() + timeout
    pending = list(arms)
    while pending:
        for a in list(pending):
            try:
                path = "/ready" if a.ours else "/v1/models"
                if httpx.get(a.base_url + path, timeout=15).status_code == 200:
                    pending.remove(a)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise ProtocolError(f"not ready after {timeout:.0f} s: {', '.join(a.name for a in pending)}")
        if pending:
            time.sleep(3)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    command_logging()
    use_engine_env()
    pair_stats.check_pairs(args.rounds, smoke=True)
    arms = split_arms(args.arms)
    if len(set(arms)) != len(arms) or len(arms) < 2:
        ap.error("--arms: at least two, each once")
    workload = Workload(
        requests=parse_requests(args.requests),
        chat=parse_requests(args.chat) if args.chat else {},
        warmup_prompts=args.warmup_prompts,
    )
    workload.client_sched, refused = client_priority.choose(args.client_sched)
    require_no_ray("before the benchmark")
    from fixture_model.build import ensure_model

    model = ensure_model()
    config = load_config(args.config)
    try:
        cfg, app_arms = cluster_config(arms, config, model)
    except ValueError as e:
        ap.error(str(e))
    plan = prompt_plan(workload, args.rounds, args.seed, local_pool_tokens(config, model))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-interleaved-"))
    log.info("cluster logs, prompts, raw client results in %s", work)
    meta = _meta(args, argv, workload, arms, app_arms, refused)
    runs = _run_rounds(args, meta, cfg, app_arms, arms, workload, plan, model, work)
    plot(runs, args.out / "vs_vllm.png")
    print(markdown(meta, runs, compare(runs, reference=arms[0])))
    void = [f"round {r.pair} {r.stack} {r.label}: {r.void}" for r in runs if r.void]
    if void:
        log.warning("%d void run(s), their figures count nowhere:\n  %s", len(void), "\n  ".join(void))
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.interleaved",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--arms", required=True, help="comma-separated: shipped, stock and their variants; first = reference"
    )
    ap.add_argument("--rounds", type=int, default=8, help="rounds (vs_vllm's pairs): every arm once each, ABC then CBA")
    ap.add_argument("--requests", default="8:300", help="requests in flight:prompts per run, comma-separated")
    ap.add_argument("--chat", default="", help="chat completions runs, in flight:prompts ('' for none)")
    ap.add_argument("--warmup-prompts", type=int, default=48, help="unmeasured requests before each arm's turn")
    ap.add_argument("--client-sched", choices=client_priority.POLICIES, default=client_priority.FIFO)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return ap


def _meta(
    args: argparse.Namespace,
    argv: list[str] | None,
    workload: Workload,
    arms: list[str],
    app_arms: list[AppArm],
    refused: str | None,
) -> Meta:
    return {
        "command": "python -m benchmarks.investigations.interleaved "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "workload": {
            **asdict(workload),
            "runs": workload.runs(),
            "arms": arms,
            "pairs": args.rounds,
            "seed": args.seed,
            "requests": {str(k): v for k, v in workload.requests.items()},
            "chat": {str(k): v for k, v in workload.chat.items()},
            "client": "vllm bench serve, custom dataset in file order, greedy, streamed",
        },
        "protocol": [
            "interleaved: every arm an application of one Ray cluster (routes "
            + ", ".join(f"{a.name} at {a.route_prefix}" for a in app_arms)
            + "), a round = every arm once, ABC then CBA; a round is what vs_vllm calls a pair",
            f"the client on {client_priority.apply_result(workload.client_sched)} scheduling, every run (checked)"
            + (f"; {args.client_sched} was asked: {refused}" if refused else ""),
        ],
        "replicas": {a.name: 1 for a in app_arms},
        "below_protocol": "interleaved lever runs in one cluster (not the headline's protocol)",
    }


def _run_rounds(
    args: argparse.Namespace,
    meta: Meta,
    cfg: ServeConfig,
    app_arms: list[AppArm],
    arms: list[str],
    workload: Workload,
    plan: dict[tuple[int, str], PromptSet],
    model: Path,
    work: Path,
) -> list[Run]:
    """One cluster with every arm deployed, the rounds run on it (results written after each), then torn down."""
    from load_tests.operate.local_cluster import LocalCluster
    from load_tests.operate.ports import free_port

    runs: list[Run] = []
    stop_on_term()  # a stopped job (SIGTERM) unwinds like Ctrl-C, so that the cluster below is torn down
    cluster = LocalCluster(num_cpus=CPUS_PER_ARM * len(arms), log_dir=work / "cluster")
    cluster.start()
    try:
        cluster.deploy(cfg, http_port=free_port(), wait_ready=False)
        for a in app_arms:
            a.base_url, a.metrics_urls = url(cluster.base_url, a.route_prefix, ""), cluster.metrics_urls
        wait_ready(app_arms)
        by_name = {a.name: a for a in app_arms}
        with HostCpuSampler() as sampler:
            for rnd, stack in pair_stats.block_order(arms, args.rounds):
                time.sleep(SETTLE_S)
                log.info("round %d: %s", rnd, stack)
                arm = by_name[stack]
                before = read_counters(arm.metrics_urls)  # the shared cluster's counters so far
                runs += run_phase(arm, stack, rnd, workload, plan, model, work, sampler, baseline=before)
                write_results(args.out, meta, runs)
    finally:
        cluster.close(graceful=False)
        left = ray_processes() + lingering_engines()
        if left:
            log.error("the cluster left Ray processes behind:\n  %s", "\n  ".join(left))
    return runs


if __name__ == "__main__":
    sys.exit(main())
