r"""The headline benchmark: the shipped config against plain vLLM, measured the way a user would measure it.

    python -m benchmarks.vs_vllm                       # cold workload, arms plain,stock,engine,shipped,
                                                       # completions at 1/8/32/128 in flight, chat at 8/32
    python -m benchmarks.vs_vllm --workload reuse      # a reused working set: plain, shipped, shipped, no offloading

What a user who weighs this project against plain vLLM would run, and nothing
of ours in the measurement path:

* the **arms** (:mod:`benchmarks.harness.arms`): ``plain`` (vLLM's OpenAI server,
  vLLM's defaults, every patch off, alone on the host), ``engine`` (the same
  server with our patches and a replica's engine settings: what our engine
  features cost or gain), ``shipped`` (the config exactly as ``ray start`` +
  ``serve deploy`` runs it), ``stock`` (stock ``ray.serve.llm``, the peer a
  Ray user would pick instead); ``*-nooffload`` twins for the reuse workload;
* the **workloads** (:mod:`benchmarks.harness.workload`, :mod:`benchmarks.harness.prompts`), through vLLM's own
  ``custom`` dataset, every prompt sent in file order:

  - ``cold``: every prompt unique within and across runs, warm-ups included
    (each phase is warmed up with prompts of its own); both arms of a pair
    get the same prompts. Each run's cache hits are read from the server's
    own counters (:mod:`benchmarks.harness.server_counters`), and **a cold run that
    shows any hit is void** (its figures count nowhere, and the benchmark
    exits 2 naming it);
  - ``reuse``: shared prefixes of whole KV blocks, each request with a suffix
    of its own, the prefixes visited in rounds (a fresh shuffle each round),
    in working sets sized against the local KV pool: one it holds, and
    larger ones that only the offload tier can keep. Each run records the
    prompt tokens served by the local cache and by the offload tier;

* driven by **vLLM's own** ``vllm bench serve`` (:mod:`benchmarks.harness.vllm_bench_serve`),
  greedy, fixed output length (``--ignore-eos``), streamed completions (and
  chat completions, ``openai-chat``, at the ``--chat`` concurrencies); its
  throughput, TTFT and TPOT as it computes them, over every request it sent;
  the client on real-time scheduling (:mod:`benchmarks.harness.client_priority`,
  ``--client-sched``), so that an arm whose threads spin cannot keep it off
  the CPU and have its wait read as latency (checked in every run);
* **a reference that fails is not a reference**: a run with any failed
  request, or whose TTFT p99 is over :data:`~benchmarks.harness.runs.STALL_P99_OVER_P50` times its
  p50 (a stall: plain vLLM's measured stalls read 17-60x, healthy runs of
  every arm 1.2-7x), is void, whatever its arm; its phase is run again
  (``--retries``) and every void run is counted in the results;
* **host-wide CPU seconds per request** from /proc/stat over the client's
  measured window (:mod:`benchmarks.harness.host`); CPU per process role beside it;
* the **statistic** (:mod:`benchmarks.harness.pair_stats`, fixed before the data):
  arms in blocks, ABC then CBA, an even number of pairs (at least 6);
  per run label and figure, the ratio of two arms within each pair, the
  median of the ratios and its bootstrap 90 % interval; each goal
  (:data:`~benchmarks.harness.comparison.GOALS`) ``met`` or ``not met`` by
  :func:`benchmarks.harness.pair_stats.goal_verdict`.

Results: ``vs_vllm.json`` (every run, every figure, every counter, the
protocol checks), ``vs_vllm.md`` (the tables) and ``vs_vllm.png`` in
``--out``, with the command line, rewritten after every phase. A stopped run
is continued with the same command and ``--resume``
(:mod:`benchmarks.harness.resume`: only the same measurement, on the same
machine kind and code; its whole pairs are kept, a pair measured in part
runs again in full). This is a benchmark, not a test: nothing
here asserts a target (tests/test_vs_vllm.py checks the protocol).

This module is the command and the run's course (the protocol checked, the
plan, the phases with their re-runs, the report); the pieces are in
:mod:`benchmarks.harness`: a phase and its client in ``phase``, the run
record and the void rule in ``runs``, the figures in ``comparison``, the
files in ``report``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import client_priority, pair_stats, resume
from benchmarks.harness.arms import (
    ARMS,
    load_config,
    make_arm,
    model_config,
    parse_arm,
    require_no_ray,
    slug,
    split_arms,
)
from benchmarks.harness.comparison import compare
from benchmarks.harness.host import HostCpuSampler, machine
from benchmarks.harness.phase import run_phase
from benchmarks.harness.prompts import PromptSet
from benchmarks.harness.report import markdown, plot, write_results
from benchmarks.harness.runs import Meta, Run, missing_runs
from benchmarks.harness.stopping import stop_on_term
from benchmarks.harness.workload import Workload, local_pool_tokens, parse_requests, prompt_plan
from load_tests.command_logs import command_logging
from serve_app.config.deploy_config import ServeConfig
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.vs_vllm")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "vs_vllm"
WORKLOADS = ("cold", "reuse")
DEFAULT_ARMS = {"cold": "plain,stock,engine,shipped", "reuse": "plain,shipped,shipped-nooffload"}
RAY_ARMS = ("shipped", "shipped-nooffload", "stock")  # arms that run in a Ray cluster of their own


# ----------------------------------------------------------------------------- the command line
def _comparison_flags(ap: argparse.ArgumentParser) -> None:
    """What is compared, and how often: the workload, the arms, the pairs."""
    ap.add_argument("--workload", choices=WORKLOADS, default="cold")
    ap.add_argument(
        "--arms",
        default=None,
        help=f"comma-separated, of {', '.join(ARMS)} and their variants (a comma before an arm's name "
        "starts the next, so a variant may list patches) (default: cold "
        f"{DEFAULT_ARMS['cold']}; reuse {DEFAULT_ARMS['reuse']})",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=pair_stats.MIN_PAIRS,
        help="blocks of every arm, ABC then CBA; even, at least 6 (or --smoke)",
    )
    ap.add_argument("--smoke", action="store_true", help="allow fewer pairs; the figures are marked below protocol")


def _workload_flags(ap: argparse.ArgumentParser) -> None:
    """What every phase sends (:class:`~benchmarks.harness.workload.Workload`'s settings)."""
    ap.add_argument(
        "--requests",
        default="1:128,8:400,32:800,128:1280",
        help="cold: requests in flight:prompts per run, comma-separated",
    )
    ap.add_argument(
        "--warmup-prompts",
        type=int,
        default=Workload.warmup_prompts,
        help="unmeasured requests (prompts of their own) when a phase starts, split over the concurrencies of its runs",
    )
    ap.add_argument("--input-len", type=int, default=Workload.input_len, help="cold: prompt tokens (BOS included)")
    ap.add_argument("--output-len", type=int, default=Workload.output_len)
    ap.add_argument(
        "--working-sets",
        default="0.5,1.5",
        help="reuse: working sets as multiples of the local KV pool (VLLM_CPU_KVCACHE_SPACE)",
    )
    ap.add_argument("--prefix-blocks", type=int, default=Workload.prefix_blocks, help="reuse: KV blocks per prefix")
    ap.add_argument("--rounds", type=int, default=Workload.rounds, help="reuse: visits of every prefix")
    ap.add_argument("--reuse-concurrency", type=int, default=Workload.reuse_concurrency)
    ap.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="measured runs: requests per second offered (vLLM's bench, Poisson from its fixed seed), "
        "in flight still capped (default: all at once, vLLM's default)",
    )
    ap.add_argument(
        "--chat",
        default="8:400,32:800",
        help="cold: chat completions runs, requests in flight:prompts per run ('' for none)",
    )


def _run_flags(ap: argparse.ArgumentParser) -> None:
    """How the run goes: re-runs, the client's scheduling, the seed, the config, where the results go."""
    ap.add_argument(
        "--retries",
        type=int,
        default=2,
        help="times a phase with a void run (failed requests, a stall, cache hits) is run again",
    )
    ap.add_argument(
        "--client-sched",
        choices=client_priority.POLICIES,
        default=client_priority.FIFO,
        help="the client's CPU scheduling: fifo (real-time, so that no arm's spinning threads starve it; "
        "needs CAP_SYS_NICE, else the run falls back to normal and says so) or normal",
    )
    ap.add_argument("--seed", type=int, default=0, help="the prompt book's seed (every prompt of the run from it)")
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml", help="the shipped config")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument(
        "--resume",
        action="store_true",
        help="continue the run recorded in --out (the same command otherwise): its pairs with a valid run of "
        "every arm at every label are kept, the others run in full; refused unless the workload, arms, pairs, "
        "seed, machine kind and code under test are the same",
    )


def parser() -> argparse.ArgumentParser:
    """``python -m benchmarks.vs_vllm``'s flags, in the order ``--help`` lists them."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.vs_vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _comparison_flags(ap)
    _workload_flags(ap)
    _run_flags(ap)
    return ap


def checked_arms(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The arms to compare, after the protocol's checks of the command (pairs, every arm's name); a command that
    fails them exits as argparse does."""
    pair_stats.check_pairs(args.pairs, smoke=args.smoke)
    arms = split_arms(args.arms or DEFAULT_ARMS[args.workload])
    for a in arms:
        try:
            parse_arm(a)
        except ValueError as e:
            ap.error(str(e))
    return arms


def workload_of(args: argparse.Namespace) -> tuple[Workload, str | None]:
    """The workload the flags name, with the client's scheduling as this host grants it, and why the one asked
    for was refused (None: it was not)."""
    workload = Workload(
        name=args.workload,
        input_len=args.input_len,
        output_len=args.output_len,
        requests=parse_requests(args.requests),
        chat=parse_requests(args.chat) if args.chat else {},
        warmup_prompts=args.warmup_prompts,
        working_sets=tuple(float(w) for w in args.working_sets.split(",")),
        prefix_blocks=args.prefix_blocks,
        rounds=args.rounds,
        reuse_concurrency=args.reuse_concurrency,
        request_rate=args.request_rate,
        client_sched=args.client_sched,
    )
    workload.client_sched, sched_refused = client_priority.choose(args.client_sched)
    return workload, sched_refused


# ----------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    """What a run measures, fixed before its first phase: the workload and arms, the model and config, every
    prompt set, and where the servers' logs, the prompts and the client's raw results go (``work``)."""

    workload: Workload
    arms: list[str]
    pairs: int
    config: ServeConfig
    model: Path
    pool_tokens: int
    prompts: dict[tuple[int, str], PromptSet]
    work: Path

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.workload.runs()]


def make_plan(args: argparse.Namespace, workload: Workload, arms: list[str]) -> Plan:
    """The plan of the run, once no Ray process is alive (plain vLLM must be alone on the host): the fixture
    model built, the config read, every prompt set drawn and checked."""
    require_no_ray("before the benchmark")
    from fixture_model.build import ensure_model

    model = ensure_model()
    config = load_config(args.config)
    pool_tokens = local_pool_tokens(config, model)
    prompts = prompt_plan(workload, args.pairs, args.seed, pool_tokens)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-vs-vllm-"))
    log.info("server and cluster logs, prompts, raw client results in %s", work)
    return Plan(workload, arms, args.pairs, config, model, pool_tokens, prompts, work)


def new_meta(argv: list[str] | None, args: argparse.Namespace, plan: Plan, sched_refused: str | None) -> Meta:
    """``vs_vllm.json``'s ``meta`` as this sitting starts: the command, when and where, the code under test, the
    workload, the protocol checks passed so far."""
    workload = plan.workload
    meta: Meta = {
        "command": "python -m benchmarks.vs_vllm " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "code": resume.code_version(),
        "workload": {
            **asdict(workload),
            "runs": workload.runs(),
            "arms": plan.arms,
            "pairs": plan.pairs,
            "seed": args.seed,
            "local_pool_tokens": plan.pool_tokens,
            "engine_kwargs": model_config(plan.config).engine_kwargs,
            "client": "vllm bench serve (vllm.benchmarks.serve), custom dataset in file order, "
            "greedy, streamed completions (chat runs: openai-chat, streamed chat completions)",
        },
        "protocol": [
            f"{len(plan.prompts)} prompt sets, no prompt in two of them (checked)",
            f"the client on {client_priority.apply_result(workload.client_sched)} scheduling, every run (checked)"
            + (f"; {args.client_sched} was asked: {sched_refused}" if sched_refused else ""),
        ],
        "replicas": {},
        "below_protocol": (
            f"{plan.pairs} pairs (the protocol takes at least {pair_stats.MIN_PAIRS})"
            if plan.pairs < pair_stats.MIN_PAIRS
            else None
        ),
    }
    meta["workload"]["requests"] = {str(k): v for k, v in workload.requests.items()}
    meta["workload"]["chat"] = {str(k): v for k, v in workload.chat.items()}
    meta["sittings"] = [meta["date"]]
    return meta


def resumed(out: Path, meta: Meta, plan: Plan) -> tuple[Meta, list[dict[str, Any]], set[tuple[int, str]]]:
    """The stopped run recorded in ``out``, continued (:mod:`benchmarks.harness.resume`): its meta with this
    sitting added, its runs as recorded, and the phases (pair, arm) it keeps. Raises
    :class:`~benchmarks.harness.resume.ResumeRefused` unless it measured what ``meta`` (this command's) does."""
    previous = resume.load(out)
    resume.check_same(previous["meta"], dict(meta))
    recorded, done = previous["runs"], resume.done_phases(previous["runs"], plan.labels, plan.arms)
    kept: Meta = previous["meta"]
    kept.setdefault("sittings", [kept["date"]]).append(meta["date"])
    kept["protocol"] += [
        (
            f"resumed {meta['date']} by `{meta['command']}`: {len(done)} of {len(plan.arms) * plan.pairs} phases "
            "kept from the earlier sitting(s)"
        ),
        *meta["protocol"],
    ]
    log.info("resuming %s: %d phase(s) kept", out / "vs_vllm.json", len(done))
    return kept, recorded, done


# ----------------------------------------------------------------------------- the phases
def _phase_check(pair: int, stack: str, attempt: int, replicas: int) -> str:
    """The protocol line of one phase: its Ray cluster gone, or (plain vLLM) no Ray process near it."""
    on_ray = parse_arm(stack)[0] in RAY_ARMS
    return f"pair {pair} {stack}{f' (run {attempt + 1})' if attempt else ''}: " + (
        f"{replicas} engine replica(s), cluster torn down, no Ray process left"
        if on_ray
        else "no Ray process alive before, during (checked around each run) or after it"
    )


def measure_phase(
    args: argparse.Namespace,
    plan: Plan,
    meta: Meta,
    runs: list[Run],
    sampler: HostCpuSampler,
    pair: int,
    stack: str,
    first: int,
) -> None:
    """One phase (pair, arm) from attempt ``first``, run again while it has a void run and ``--retries`` are
    left; each attempt's runs appended to ``runs`` and the results rewritten after it (a stopped run keeps them)."""
    for attempt in range(first, first + 1 + args.retries):
        log.info("pair %d: %s%s", pair, stack, f" (run again: {attempt})" if attempt else "")
        with make_arm(stack, plan.config, plan.model, plan.work / f"{slug(stack)}-{pair}-{attempt}") as arm:
            meta["replicas"][f"{pair}-{stack}"] = arm.replicas
            phase = run_phase(arm, stack, pair, plan.workload, plan.prompts, plan.model, plan.work, sampler, attempt)
        runs.extend(phase)
        meta["protocol"].append(_phase_check(pair, stack, attempt, arm.replicas))
        write_results(args.out, meta, runs)
        if not any(r.void for r in phase):
            return
        log.warning(
            "pair %d %s: %d void run(s)%s",
            pair,
            stack,
            sum(bool(r.void) for r in phase),
            "; the phase runs again" if attempt < first + args.retries else "; no re-run left",
        )


def measure(
    args: argparse.Namespace, plan: Plan, meta: Meta, recorded: list[dict[str, Any]], done: set[tuple[int, str]]
) -> list[Run]:
    """Every phase in block order (ABC then CBA), those ``done`` in an earlier sitting kept as ``recorded``."""
    runs: list[Run] = [Run(**r) for r in recorded]
    with HostCpuSampler() as sampler:
        for pair, stack in pair_stats.block_order(plan.arms, plan.pairs):
            if (pair, stack) in done:
                log.info("pair %d: %s kept from an earlier sitting", pair, stack)
                continue
            measure_phase(args, plan, meta, runs, sampler, pair, stack, resume.next_attempt(recorded, pair, stack))
    return runs


# ----------------------------------------------------------------------------- the report
def report(args: argparse.Namespace, plan: Plan, meta: Meta, runs: list[Run]) -> int:
    """The plot and the tables (on stdout), the void runs named; 2 where a (pair, arm, label) has no valid run
    after its re-runs, else 0."""
    plot(runs, args.out / "vs_vllm.png")
    print(markdown(meta, runs, compare(runs)))
    void = [f"pair {r.pair} {r.stack} {r.label} (run {r.attempt + 1}): {r.void}" for r in runs if r.void]
    if void:
        log.warning("%d void run(s), their figures count nowhere:\n  %s", len(void), "\n  ".join(void))
    missing = missing_runs(runs, plan.arms, plan.pairs, plan.labels)
    if missing:
        log.error("no valid run after %d re-run(s) for: %s", args.retries, ", ".join(missing))
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    command_logging()
    stop_on_term()  # a stopped run (SIGTERM) unwinds like Ctrl-C: what it started is stopped
    use_engine_env()
    arms = checked_arms(ap, args)
    workload, sched_refused = workload_of(args)
    plan = make_plan(args, workload, arms)
    meta = new_meta(argv, args, plan, sched_refused)
    recorded: list[dict[str, Any]] = []  # a resumed run's runs, as recorded
    done: set[tuple[int, str]] = set()
    if args.resume:
        try:
            meta, recorded, done = resumed(args.out, meta, plan)
        except resume.ResumeRefused as e:
            ap.error(f"--resume: {e}")
    runs = measure(args, plan, meta, recorded, done)
    return report(args, plan, meta, runs)


if __name__ == "__main__":
    sys.exit(main())
