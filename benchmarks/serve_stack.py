r"""What each layer costs: the same workload against every serving stack, interleaved, as ratios to plain vLLM.

    python -m benchmarks.serve_stack [--rounds 3] [--requests 200] [--concurrency 32] [--out docs/benchmarks]

Workload (fixture model): prompts of ``--prompt-tokens`` tokens (128), ``--output-tokens``
(64) generated with ``ignore_eos``, greedy, fixed concurrency, streamed; a
``prefix`` variant puts 256 shared tokens (two KV blocks, four groups) in
front of each prompt. The targets, the phase each is measured in and what
each changes are one table, :data:`benchmarks.harness.targets.TARGETS` (``--list``
prints it); ``S`` is ``serve_config.yaml`` itself, what users deploy.

Each phase is its own Ray cluster; a vLLM server stays up throughout, so
every phase measures ``a`` too, and the ceiling runs last.
Within a phase runs are interleaved round by round (a b c0 a b c0 ...), and
each target's numbers are divided by the same round's ``a``, so drift of
the machine cancels; every target is warmed up before the first round, and
runs are kept ``--settle-s`` (1.5 s) apart so that no run starts while the
previous target's stock engine still spins (upstream spins for 1 s after its
last step). Results: ``serve_stack.json`` and ``serve_stack.md`` in
``--out``, with the command line that produced them, rewritten after every
phase; a phase that fails is recorded there and the others still run.

This is a benchmark, not a test: nothing here asserts a target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from benchmarks.harness.targets import APP_OF, BY_NAME, ENGINE, LABELS, PHASES, phase_serve_config, table_markdown
from load_tests.command_logs import command_logging
from patches.framework.switches import ALL, OFF_ENV
from serve_app.engine.engine_env import ENGINE_ENV, use_engine_env

if TYPE_CHECKING:
    from testkit.server_process import ServerProcess

log = logging.getLogger("fuzzserve.benchmarks")
REPO = Path(__file__).resolve().parents[1]
# Pause before each run: a stock vLLM engine (EngineCore and worker) keeps
# spinning for 1 s after its last step (upstream's busy window), which would
# otherwise compete with the first second of the next run.
SETTLE_S = 1.5


# ----------------------------------------------------------------------------- results
class RunStats(TypedDict):
    """One run's throughput and latency (seconds; each percentile None when no request had the figure)."""

    wall_s: float
    requests: int
    req_per_s: float
    tok_per_s: float
    ttft_p50: float | None
    ttft_p99: float | None
    ttft_count: int
    itl_p50: float | None
    itl_p99: float | None
    itl_count: int
    tpot_p50: float | None
    tpot_p99: float | None
    tpot_count: int


class StackRun(RunStats):
    """One run of ``serve_stack.json``: which target, variant, phase and round, then its :class:`RunStats`; the
    CPU seconds by column (:func:`cpu_columns`) and the warm-up it had, except for the ceiling's runs."""

    phase: str
    round: int
    variant: str
    target: str
    cpu_s: NotRequired[dict[str, float]]
    warmup_requests: NotRequired[int]


# the figures compared with a's, in a ratio row's order
Figure = Literal["req_per_s", "tok_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "tpot_p50", "tpot_p99"]


class RatioRow(TypedDict):
    """Per (variant, target): each figure's median over rounds and the median of its ratio to ``a``'s."""

    variant: str
    target: str
    label: str
    runs: int
    req_per_s: float | None
    req_per_s_x_a: float | None
    tok_per_s: float | None
    tok_per_s_x_a: float | None
    ttft_p50: float | None
    ttft_p50_x_a: float | None
    ttft_p99: float | None
    ttft_p99_x_a: float | None
    itl_p50: float | None
    itl_p50_x_a: float | None
    itl_p99: float | None
    itl_p99_x_a: float | None
    tpot_p50: float | None
    tpot_p50_x_a: float | None
    tpot_p99: float | None
    tpot_p99_x_a: float | None


class StackWorkload(TypedDict):
    prompt_tokens: int
    output_tokens: int
    concurrency: int
    requests_per_run: int
    rounds: int


class StackMeta(TypedDict):
    """``serve_stack.json``'s ``meta``: how and where it was measured, and the phases that failed (and why)."""

    command: str
    date: str
    machine: str
    workload: StackWorkload
    failed_phases: dict[str, str]
    notes: NotRequired[str]


# ----------------------------------------------------------------------------- workload
WARMUP_SEED = 7_777_777  # the warm-up's prompts (the measured runs use seed 0)


def prompts(n: int, tokens: int, variant: str, seed: int = 0) -> list[str]:
    """``n`` prompts of ``tokens`` tokens (one fixture-vocabulary word per token, <s> included)."""
    from fixture_model.tasks import LETTERS, NUMBERS

    rng = random.Random(seed)
    words = LETTERS + NUMBERS
    prefixes = [" ".join(rng.choice(words) for _ in range(256)) for _ in range(4)]
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words) for _ in range(tokens - 1))
        out.append(f"{prefixes[i % 4]} {body}" if variant == "prefix" else body)
    return out


def fuzz_xargs(i: int) -> dict[str, Any]:
    from load_tests.plan.workload import FUZZ_LEVELS

    rng = random.Random(i)
    return {
        "fuzz_strength": rng.choice(FUZZ_LEVELS[1:]),
        "fuzz_mode": rng.choice(("scale", "gaussian")),
        "fuzz_seed": rng.randrange(4),
    }


async def run_http(
    base_url: str, ps: list[str], out_tokens: int, concurrency: int, fuzz: bool, api_key: str | None = None
) -> RunStats:
    """Stream every prompt through ``base_url`` with ``concurrency`` in flight; return throughput and latency."""
    import aiohttp

    from load_tests.load.client import send
    from load_tests.load.drive import drive
    from load_tests.plan.profiles import Profile
    from load_tests.plan.workload import RequestSpec

    results = []
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            body = {
                "model": "fixture",
                "prompt": ps[i],
                "max_tokens": out_tokens,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            if fuzz:
                body["vllm_xargs"] = fuzz_xargs(i)
            spec = RequestSpec(i, "/v1/completions", body, stream=True)
            # no retry of a refusal at the ingress: vLLM's bench serve counts one as failed, and so does this
            results.append(
                await send(session, base_url, spec, t0, timeout_s=600, headers=headers, ingress_retry_delays_s=())
            )

        await drive(Profile(kind="fixed", concurrency=concurrency, max_requests=len(ps)), one)
    wall = time.monotonic() - t0
    ok = [r for r in results if r.outcome == "ok"]
    if len(ok) != len(ps):
        bad = [r for r in results if r.outcome != "ok"][:3]
        raise RuntimeError(
            f"{base_url}: {len(ps) - len(ok)} of {len(ps)} requests failed: {[r.to_json() for r in bad]}"
        )
    # TTFT by tokens (load_tests.load.client): a fuzzed stream whose tokens decode to "" has one too.
    return _stats(
        wall,
        [r.ttft for r in ok if r.ttft is not None],
        [x for r in ok for x in r.itl],
        sum(r.output_tokens for r in ok),
        len(ok),
        [r.tpot for r in ok if r.tpot is not None],
    )


def _stats(
    wall: float, ttft: list[float], itl: list[float], tokens: int, n: int, tpot: Sequence[float] = ()
) -> RunStats:
    from load_tests.judge.figures import percentiles

    ttft_p, itl_p, tpot_p = (percentiles(xs, (50, 99)) for xs in (ttft, itl, tpot))
    return {
        "wall_s": wall,
        "requests": n,
        "req_per_s": n / wall,
        "tok_per_s": tokens / wall,
        "ttft_p50": ttft_p["p50"],
        "ttft_p99": ttft_p["p99"],
        "ttft_count": _count(ttft_p),
        "itl_p50": itl_p["p50"],
        "itl_p99": itl_p["p99"],
        "itl_count": _count(itl_p),
        "tpot_p50": tpot_p["p50"],
        "tpot_p99": tpot_p["p99"],
        "tpot_count": _count(tpot_p),
    }


def _count(p: Mapping[str, float | int | None]) -> int:
    """How many values a :func:`load_tests.judge.figures.percentiles` result covers."""
    n = p["count"]
    if not isinstance(n, int):
        raise TypeError(f"a percentiles count is {n!r}, not an int")
    return n


# ----------------------------------------------------------------------------- targets
def start_vllm_server(model: Path, log_dir: Path) -> tuple[ServerProcess, str]:
    from load_tests.operate.ports import free_port
    from testkit.server_process import ServerProcess

    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "fixture",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--enable-prefix-caching",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    srv = ServerProcess(
        argv, f"http://127.0.0.1:{port}/health", log_path=log_dir / "vllm_server.log", env={**ENGINE_ENV, OFF_ENV: ALL}
    )
    return srv, f"http://127.0.0.1:{port}"


def offline_ceiling(model: Path, ps: list[str], out_tokens: int) -> RunStats:
    """The same prompts through ``LLM.generate`` in a child process (patches off, no HTTP)."""
    from testkit.engine_host import EngineHost

    host = EngineHost(env={**ENGINE_ENV, OFF_ENV: ALL}, model=str(model), **ENGINE)
    try:
        params = {"temperature": 0.0, "max_tokens": out_tokens, "ignore_eos": True}
        host.generate(ps[:8], params)  # warm-up
        t = time.monotonic()
        outs = host.generate(ps, params)
        wall = time.monotonic() - t
    finally:
        host.close()
    return _stats(wall, [], [], sum(len(o["token_ids"]) for o in outs), len(outs))


# ----------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        print(table_markdown())
        return 0
    command_logging()
    use_engine_env()
    from fixture_model.build import ensure_model

    model = ensure_model()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    phases = args.phases.split(",")
    work = {v: prompts(args.requests, args.prompt_tokens, v) for v in variants}
    runs: list[StackRun] = []
    log_dir = Path(tempfile.mkdtemp(prefix="fuzzserve-bench-"))  # server and cluster logs, not results
    log.info("logs in %s", log_dir)
    meta = _meta(args, argv)
    if args.update:
        _keep_previous(args.out / "serve_stack.json", meta, runs, phases)

    def write() -> None:  # after every phase: a later failure loses nothing measured
        table = ratios(runs)
        (args.out / "serve_stack.json").write_text(json.dumps({"meta": meta, "runs": runs, "ratios": table}, indent=2))
        (args.out / "serve_stack.md").write_text(markdown(meta, table, runs))

    srv, base_a = start_vllm_server(model, log_dir)
    try:
        for phase in [p for p in phases if p in PHASES]:
            try:
                run_phase(phase, model, args, work, base_a, runs, log_dir / phase)
            except Exception as e:  # record it and go on to the next phase
                log.exception("phase %s failed", phase)
                meta["failed_phases"][phase] = f"{type(e).__name__}: {str(e)[:1000]}"
            write()
    finally:
        srv.close()
    if "ceiling" in phases:
        for variant in variants:
            runs.append(
                {
                    "phase": "ceiling",
                    "round": 0,
                    "variant": variant,
                    "target": "ceil",
                    **offline_ceiling(model, work[variant], args.output_tokens),
                }
            )
    write()
    log.info("wrote %s", args.out / "serve_stack.md")
    return 1 if meta["failed_phases"] else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="requests per run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--variants", default="plain,prefix")
    ap.add_argument(
        "--phases",
        default="shipped,shippedeager,stock2,stockdirect2,shippedrouter,ceiling",
        help=f"comma-separated, of: {', '.join(PHASES)}, ceiling",
    )
    ap.add_argument("--list", action="store_true", help="print the targets and their phases, and exit")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help="pause before each run: a stock engine keeps spinning for 1 s after its last step",
    )
    ap.add_argument(
        "--warmup-requests",
        type=int,
        default=64,
        help="unmeasured requests per target and variant before a phase's first round (0 = none)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    ap.add_argument(
        "--update",
        action="store_true",
        help="rerun only --phases: keep the other phases' runs from the serve_stack.json in --out",
    )
    return ap.parse_args(argv)


def _meta(args: argparse.Namespace, argv: list[str] | None) -> StackMeta:
    return {
        "command": "python -m benchmarks.serve_stack " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "workload": {
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "concurrency": args.concurrency,
            "requests_per_run": args.requests,
            "rounds": args.rounds,
        },
        "failed_phases": {},
    }


def _keep_previous(previous: Path, meta: StackMeta, runs: list[StackRun], phases: list[str]) -> None:
    """``--update``: the other phases' runs, failures and notes from ``previous`` (when there is one), and both
    commands and dates in ``meta``; a previous file measured with another workload stops the run."""
    if not previous.exists():
        return
    old = json.loads(previous.read_text())
    if old["meta"]["workload"] != meta["workload"]:
        raise SystemExit(f"--update: {previous} was measured with another workload: {old['meta']['workload']}")
    runs.extend(r for r in old["runs"] if r["phase"] not in phases)
    meta["command"] = f"{old['meta']['command']}; then {meta['command']}"
    meta["date"] = f"{old['meta']['date']}; then {meta['date']}"
    meta["failed_phases"] = {k: v for k, v in old["meta"].get("failed_phases", {}).items() if k not in phases}
    if old["meta"].get("notes"):
        meta["notes"] = old["meta"]["notes"]


def run_phase(
    phase: str,
    model: Path,
    args: argparse.Namespace,
    work: dict[str, list[str]],
    base_a: str,
    runs: list[StackRun],
    log_dir: Path,
) -> None:
    """One phase: its own Ray cluster, every target interleaved with ``a`` round by round."""
    from rich.progress import Progress

    from benchmarks.harness import cpu_accounting
    from load_tests.operate.local_cluster import LocalCluster

    cfg, routes, env = phase_serve_config(phase, model)
    targets = ["a", *PHASES[phase]]
    variants = list(work)
    # Logical CPUs (Ray's scheduling units, not cores) enough to place every
    # target of a phase at once: four engine replicas plus their ingresses
    # overflow the default 8 and a router would wait forever to be scheduled.
    with LocalCluster(env=env, log_dir=log_dir, num_cpus=32) as cluster:
        log.info("phase %s: deploying %s", phase, ", ".join(routes))
        cluster.deploy(cfg, wait_ready=False)
        cluster.wait_http(set(routes.values()))
        bases = {"a": base_a, **{t: cluster.base_url + routes[t] for t in PHASES[phase]}}
        warm_up(bases, args, variants)
        with Progress() as progress:
            task = progress.add_task(f"phase {phase}", total=args.rounds * len(variants) * len(targets))
            for rnd in range(args.rounds):
                for variant in variants:
                    for t in targets:  # interleaved: a b c ... a b c ...
                        time.sleep(args.settle_s)  # the previous target's engine stops spinning
                        before = cpu_accounting.snapshot()
                        stats = asyncio.run(
                            run_http(
                                bases[t], work[variant], args.output_tokens, args.concurrency, fuzz=BY_NAME[t].fuzz
                            )
                        )
                        cpu = cpu_accounting.delta(before, cpu_accounting.snapshot())
                        runs.append(
                            {
                                "phase": phase,
                                "round": rnd,
                                "variant": variant,
                                "target": t,
                                **stats,
                                "cpu_s": cpu_columns(cpu, APP_OF.get(t, t)),
                                "warmup_requests": args.warmup_requests,
                            }
                        )
                        progress.advance(task)


def warm_up(bases: dict[str, str], args: argparse.Namespace, variants: list[str]) -> None:
    """Send every target of a phase ``--warmup-requests`` unmeasured requests per variant.

    Each phase deploys its targets fresh, while the vLLM server (a) stays up
    for the whole benchmark and is warm after the first phase: without this,
    every target's first round paid its cold start (first requests through
    a new replica, HTTP connections, the engine's first large batches) and
    ``a``'s did not (the measurements: docs/benchmarks.md, "cold starts").
    Other prompts than the measured ones (their own seed), so that the
    warm-up leaves nothing in a prefix cache that the measured runs could hit.
    """
    if args.warmup_requests <= 0:
        return
    for variant in variants:
        ps = prompts(args.warmup_requests, args.prompt_tokens, variant, seed=WARMUP_SEED)
        for t, base in bases.items():
            asyncio.run(run_http(base, ps, args.output_tokens, args.concurrency, fuzz=BY_NAME[t].fuzz))


def ratios(runs: list[StackRun]) -> list[RatioRow]:
    """Per (variant, target): the median over rounds of value / the same phase-round-variant's ``a``."""
    ref = {(r["phase"], r["round"], r["variant"]): r for r in runs if r["target"] == "a"}
    a_all = [r for r in runs if r["target"] == "a"]
    out: list[RatioRow] = []
    for variant in sorted({r["variant"] for r in runs}):
        for target in [t for t in LABELS if any(r["target"] == t and r["variant"] == variant for r in runs)]:
            mine = [r for r in runs if r["target"] == target and r["variant"] == variant]
            out.append(
                {
                    "variant": variant,
                    "target": target,
                    "label": LABELS[target],
                    "runs": len(mine),
                    "req_per_s": _median(mine, "req_per_s"),
                    "req_per_s_x_a": _x_a(mine, "req_per_s", ref, a_all, variant),
                    "tok_per_s": _median(mine, "tok_per_s"),
                    "tok_per_s_x_a": _x_a(mine, "tok_per_s", ref, a_all, variant),
                    "ttft_p50": _median(mine, "ttft_p50"),
                    "ttft_p50_x_a": _x_a(mine, "ttft_p50", ref, a_all, variant),
                    "ttft_p99": _median(mine, "ttft_p99"),
                    "ttft_p99_x_a": _x_a(mine, "ttft_p99", ref, a_all, variant),
                    "itl_p50": _median(mine, "itl_p50"),
                    "itl_p50_x_a": _x_a(mine, "itl_p50", ref, a_all, variant),
                    "itl_p99": _median(mine, "itl_p99"),
                    "itl_p99_x_a": _x_a(mine, "itl_p99", ref, a_all, variant),
                    "tpot_p50": _median(mine, "tpot_p50"),
                    "tpot_p50_x_a": _x_a(mine, "tpot_p50", ref, a_all, variant),
                    "tpot_p99": _median(mine, "tpot_p99"),
                    "tpot_p99_x_a": _x_a(mine, "tpot_p99", ref, a_all, variant),
                }
            )
    return out


def _median(mine: list[StackRun], k: Figure) -> float | None:
    """The median of figure ``k`` over the runs that have it."""
    vals = [v for r in mine if (v := r.get(k)) is not None]
    return statistics.median(vals) if vals else None


def _x_a(
    mine: list[StackRun],
    k: Figure,
    ref: Mapping[tuple[str, int, str], StackRun],
    a_all: list[StackRun],
    variant: str,
) -> float | None:
    """The median over ``mine`` of figure ``k`` / the same phase-round-variant's ``a`` (``ref``), or, where the
    phase has no ``a`` (the ceiling), / the median of every ``a`` run of the variant (``a_all``)."""
    per_round = []
    for r in mine:
        base = ref.get((r["phase"], r["round"], variant))
        b: float | None
        if base is None:  # the ceiling: against the median of every a run
            bs = [v for x in a_all if x["variant"] == variant and (v := x.get(k)) is not None]
            b = statistics.median(bs) if bs else None
        else:
            b = base.get(k)
        if (v := r.get(k)) is not None and b:
            per_round.append(v / b)
    return statistics.median(per_round) if per_round else None


def _fmt(v: float | None, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}{unit}"


def markdown(meta: StackMeta, table: list[RatioRow], runs: list[StackRun] | None = None) -> str:
    w = meta["workload"]
    lines = [
        "# Serving stack benchmark",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}.",
        "",
        (
            f"{w['prompt_tokens']} prompt tokens, {w['output_tokens']} output tokens (ignore_eos), streamed, "
            f"concurrency {w['concurrency']}, {w['requests_per_run']} requests per run, {w['rounds']} interleaved "
            "rounds; each number is the median over rounds, each ratio the median of (run / the same round's a)."
        ),
        "",
    ]
    for phase, why in meta.get("failed_phases", {}).items():
        lines += [f"**Phase {phase} failed**: {why}", ""]
    if meta.get("notes"):
        lines += [f"Note: {meta['notes']}", ""]
    if runs is not None:
        warmed = sorted({r["phase"] for r in runs if r.get("warmup_requests")})
        cold = sorted({r["phase"] for r in runs if not r.get("warmup_requests") and r["phase"] != "ceiling"})
        if cold:
            lines += [
                (
                    f"Warm-up before the first round: {', '.join(warmed) or 'no phase'}; measured without it "
                    f"(every target's first round paid its cold start, `a`'s did not): {', '.join(cold)}."
                ),
                "",
            ]
    for variant in sorted({r["variant"] for r in table}):
        lines += [
            f"## Workload: {variant}",
            "",
            (
                "| target | | req/s | x a | tok/s | TTFT p50 ms | x a | TTFT p99 ms | x a | TPOT p50 ms | x a | "
                "TPOT p99 ms | ITL p50 ms | ITL p99 ms |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in table if r["variant"] == variant):
            lines.append(
                f"| {r['target']} | {r['label']} | {_fmt(r['req_per_s'])} | {_fmt(r['req_per_s_x_a'], digits=2)} | "
                f"{_fmt(r['tok_per_s'], digits=0)} | {_fmt(r['ttft_p50'], 1000, digits=0)} | "
                f"{_fmt(r['ttft_p50_x_a'], digits=2)} | {_fmt(r['ttft_p99'], 1000, digits=0)} | "
                f"{_fmt(r['ttft_p99_x_a'], digits=2)} | {_fmt(r.get('tpot_p50'), 1000)} | "
                f"{_fmt(r.get('tpot_p50_x_a'), digits=2)} | {_fmt(r.get('tpot_p99'), 1000)} | "
                f"{_fmt(r['itl_p50'], 1000)} | {_fmt(r['itl_p99'], 1000)} |"
            )
        lines.append("")
        if runs is not None:
            lines += cpu_markdown(runs, variant)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- where the CPU goes
CPU_COLUMNS = ("client", "proxy", "ingress", "frontend", "engine", "Ray", "idle targets")


def cpu_columns(cpu: dict[str, float], app: str) -> dict[str, float]:
    """Fold per-role CPU seconds (see ``cpu_accounting``) into the columns of one target's run.

    ``frontend`` is the process that runs vLLM's AsyncLLM: the API server for
    ``a``, the engine replica (``LLMServer``) for the Serve targets, which in
    the direct-streaming targets also serves HTTP. ``ingress`` is the router
    replica (``OpenAiIngress``/``FuzzIngress``). ``engine`` is EngineCore and its
    worker process (scheduler, model, KV offload copies). ``idle targets`` is what the
    other targets' processes (up, but not driven) used meanwhile.
    """
    out = dict.fromkeys(CPU_COLUMNS, 0.0)
    for role, sec in cpu.items():
        if role == "load generator":
            col = "client"
        elif role == "Serve proxy":
            col = "proxy"
        elif role in ("Serve controller", "Ray system", "Ray worker (other)"):
            col = "Ray"
        elif role == "vLLM API server":
            col = "frontend" if app == "a" else "idle targets"
        elif role == "EngineCore of vLLM API server":
            col = "engine" if app == "a" else "idle targets"
        elif role.startswith(f"replica {app}:"):
            col = "frontend" if "Server" in role else "ingress"
        elif role.startswith(f"EngineCore of replica {app}:"):
            col = "engine"
        else:
            col = "idle targets"
        out[col] += sec
    return out


def cpu_markdown(runs: list[StackRun], variant: str) -> list[str]:
    """Median over rounds of CPU milliseconds per request, per column, for each target."""
    lines = [
        f"### Where the CPU goes ({variant}): CPU ms per request, median over rounds",
        "",
        "| target | " + " | ".join(CPU_COLUMNS) + " | total | cores busy |",
        "|---|" + "---|" * (len(CPU_COLUMNS) + 2),
    ]
    for t in LABELS:
        mine = [r for r in runs if r["target"] == t and r["variant"] == variant and r.get("cpu_s")]
        if not mine:
            continue
        cells = [statistics.median(1000 * r["cpu_s"][c] / r["requests"] for r in mine) for c in CPU_COLUMNS]
        total = statistics.median(1000 * sum(r["cpu_s"].values()) / r["requests"] for r in mine)
        busy = statistics.median(sum(r["cpu_s"].values()) / r["wall_s"] for r in mine)
        lines.append(f"| {t} | " + " | ".join(f"{c:.0f}" for c in cells) + f" | {total:.0f} | {busy:.2f} |")
    return [*lines, ""]


def _machine() -> str:
    import psutil

    return (
        f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total // (1 << 30)} GiB, Python {platform.python_version()}"
    )


if __name__ == "__main__":
    sys.exit(main())
