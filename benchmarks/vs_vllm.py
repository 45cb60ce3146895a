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
* the **workloads** (:mod:`benchmarks.harness.prompts`), through vLLM's own
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
  request, or whose TTFT p99 is over :data:`STALL_P99_OVER_P50` times its
  p50 (a stall: plain vLLM's measured stalls read 17-60x, healthy runs of
  every arm 1.2-7x), is void, whatever its arm; its phase is run again
  (``--retries``) and every void run is counted in the results;
* **host-wide CPU seconds per request** from /proc/stat over the client's
  measured window (:mod:`benchmarks.harness.host`); CPU per process role beside it;
* the **statistic** (:mod:`benchmarks.harness.pair_stats`, fixed before the data):
  arms in blocks, ABC then CBA, an even number of pairs (at least 6);
  per run label and figure, the ratio of two arms within each pair, the
  median of the ratios and its bootstrap 90 % interval; each goal
  (:data:`GOALS`) ``met`` or ``not met`` by :func:`benchmarks.harness.pair_stats.goal_verdict`.

Results: ``vs_vllm.json`` (every run, every figure, every counter, the
protocol checks), ``vs_vllm.md`` (the tables) and ``vs_vllm.png`` in
``--out``, with the command line, rewritten after every phase. A stopped run
is continued with the same command and ``--resume``
(:mod:`benchmarks.harness.resume`: only the same measurement, on the same
machine kind and code; its whole pairs are kept, a pair measured in part
runs again in full). This is a benchmark, not a test: nothing
here asserts a target (tests/test_vs_vllm.py checks the protocol).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypedDict

from benchmarks.harness import client_priority, pair_stats, resume
from benchmarks.harness.arms import (
    ARMS,
    MODEL_NAME,
    ProtocolError,
    load_config,
    make_arm,
    model_config,
    parse_arm,
    require_no_ray,
    slug,
    split_arms,
)
from benchmarks.harness.cpu_accounting import CLIENT_ROLE
from benchmarks.harness.host import HostCpuSampler
from benchmarks.harness.prompts import BLOCK_TOKENS, PromptBook, PromptSet, check_disjoint
from benchmarks.harness.server_counters import CacheCounters, CountersJson, wait_for_requests
from benchmarks.harness.stopping import stop_on_term
from benchmarks.harness.vllm_bench_serve import SCHED_LINE
from load_tests.command_logs import command_logging
from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig
from serve_app.engine.engine_env import ENGINE_ENV, KV_CACHE_SPACE, use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.vs_vllm")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "vs_vllm"
WORKLOADS = ("cold", "reuse")
DEFAULT_ARMS = {"cold": "plain,stock,engine,shipped", "reuse": "plain,shipped,shipped-nooffload"}
# A run is a stall (void, whatever its arm) when its TTFT p99 is over this many times its p50.
STALL_P99_OVER_P50 = 10.0
# A reference's run (plain, stock) stalled outside its engine when the client's mean TTFT is over this many times
# the server's own (vllm:time_to_first_token_seconds over the same run) and longer by at least STALL_OUTSIDE_MS:
# the request waited in a starved frontend, not in the engine (healthy plain: 3.7 ms of 12 ms outside).
STALL_OUTSIDE_X = 3.0
STALL_OUTSIDE_MS = 20.0
REFERENCE_ARMS = ("plain", "stock")
CHAT_PREFIX = "chat"  # a chat run's label: "chat8" (vLLM's bench backend openai-chat, /v1/chat/completions)
REFERENCE = "plain"
# Figures compared as ratios (candidate / reference) pair by pair; Run attribute or (attribute, percentile).
FIGURES = {
    "req_per_s": "requests/s",
    "host_cpu_s_per_request": "host CPU per request",
    "ttft_p50": "TTFT p50",
    "ttft_p99": "TTFT p99",
    "tpot_p50": "TPOT p50",
    "e2el_p50": "latency p50",
}
# Beside the figures: the benchmark client's CPU per request (cpu_accounting.CLIENT_ROLE), fixed work whatever the
# arm (the same prompts, every token streamed), so its pair ratio marks the host's speed in the two phases. The
# host ran 1.3-1.5x slower for minutes at a time on this machine kind, every process alike (docs/results_log.md,
# 2026-11-29 04:34); a ratio far from 1 says the pair's arms met different speeds. Reported, never judged.
SPEED_MARKER = "client_cpu_per_request"
SPEED_MARKER_TITLE = "client CPU per request (host speed)"


@dataclass(frozen=True)
class Goal:
    """One goal of the headline: ``candidate / reference`` of ``figure`` at most (or at least) ``ratio``."""

    candidate: str
    reference: str
    figure: str
    ratio: float
    higher_is_better: bool

    def text(self) -> str:
        return (
            f"{FIGURES[self.figure]} {self.candidate} / {self.reference} "
            f"{'>=' if self.higher_is_better else '<='} {self.ratio:g}x"
        )


# Issue 45's goals, for every run label (completions and chat): the first token no slower than plain's by more
# than 10 % nor than the stock peer's, as many requests/s as plain, no more host CPU per request.
GOALS = (
    Goal("shipped", "plain", "ttft_p50", 1.1, False),
    Goal("shipped", "stock", "ttft_p50", 1.0, False),
    Goal("shipped", "plain", "req_per_s", 1.0, True),
    Goal("shipped", "plain", "host_cpu_s_per_request", 1.0, False),
)


@dataclass
class Workload:
    """What every phase sends: a warm-up, then one run per label, each from prompts no other run shares."""

    name: str = "cold"
    input_len: int = 128  # tokens per prompt, BOS included (cold)
    output_len: int = 64
    # cold: prompts per run by requests in flight (about 15-20 s per run here)
    requests: dict[int, int] = field(default_factory=lambda: {1: 128, 8: 400, 32: 800, 128: 1280})
    # cold: chat completions, prompts per run by requests in flight (labels chat8, chat32)
    chat: dict[int, int] = field(default_factory=lambda: {8: 400, 32: 800})
    warmup_prompts: int = 300
    # reuse: working sets as multiples of the local KV pool, visited `rounds` times at `reuse_concurrency`
    working_sets: tuple[float, ...] = (0.5, 1.5)
    prefix_blocks: int = 7
    suffix_tokens: int = 32
    rounds: int = 2
    reuse_concurrency: int = 32
    # measured runs: requests per second offered (vLLM's bench: Poisson arrivals from its fixed seed, the same
    # schedule for every arm), the requests in flight still capped; None = vLLM's default, all at once
    request_rate: float | None = None
    # the client's CPU scheduling (benchmarks.harness.client_priority): fifo, so that no arm's spinning threads
    # starve the client and its own wait is read as the server's latency; normal, the old way
    client_sched: str = client_priority.FIFO

    def runs(self) -> list[tuple[str, int]]:
        """(label, requests in flight) of each measured run, in order."""
        if self.name == "cold":
            return [(f"c{c}", c) for c in sorted(self.requests)] + [(f"{CHAT_PREFIX}{c}", c) for c in sorted(self.chat)]
        return [(f"ws{w:g}x", self.reuse_concurrency) for w in self.working_sets]


class RunPercentiles(TypedDict):
    """One latency figure of a run, in ms, as vLLM's bench reports it (None where its result lacks it); ``mean``
    only where the client's result was read (:func:`summarize_run`)."""

    p50: float | None
    p99: float | None
    mean: NotRequired[float | None]


@dataclass
class Run:
    """One ``vllm bench serve`` run against one phase."""

    stack: str  # the arm
    pair: int
    label: str
    concurrency: int
    completed: int
    failed: int
    duration_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_ms: RunPercentiles
    tpot_ms: RunPercentiles
    itl_ms: RunPercentiles
    e2el_ms: RunPercentiles
    window_s: float
    host_cpu_s: float
    host_cpu_s_per_request: float
    host_busy_cores: float
    prompts: dict[str, int | str] = field(default_factory=dict)  # the prompt set's description
    counters: CountersJson = field(default_factory=CountersJson)  # the server's counters over the run
    void: str | None = None  # why the run counts nowhere
    attempt: int = 0  # 0, or which re-run of its phase (a phase with a void run is run again)
    roles_ms_per_request: dict[str, float] = field(default_factory=dict)
    # ms per request the role's threads waited for a core (runnable, not running; schedstat), over the client's
    # main run; empty in runs recorded before it was read
    roles_wait_ms_per_request: dict[str, float] = field(default_factory=dict)
    # CPU seconds per second the hypervisor took from the host over the window (/proc/stat's steal; not inside
    # host_cpu_s): reported beside the figures, never judged; None in runs recorded before it was read
    host_steal_cores: float | None = None

    def figure(self, name: str) -> float:
        if name == SPEED_MARKER:  # ms; 0.0 where the run recorded no client process
            return self.roles_ms_per_request.get(CLIENT_ROLE, 0.0)
        if name in ("ttft_p50", "ttft_p99", "tpot_p50", "e2el_p50"):
            metric, pct = name.rsplit("_", 1)
            return getattr(self, f"{metric}_ms")[pct]
        return getattr(self, name)


class Meta(TypedDict):
    """``vs_vllm.json``'s ``meta``: the command, when and where, the workload (:class:`Workload`'s fields and the
    run's settings), the protocol checks as they passed, each phase's engine replicas, and why the run is below
    protocol (None: it is not)."""

    command: str
    date: str
    machine: str
    workload: dict[str, Any]
    protocol: list[str]
    replicas: dict[str, int]
    below_protocol: str | None
    # the git tree of what the run measures (benchmarks.harness.resume.code_version; None: not vouched for), and
    # when each sitting of a resumed run started (absent in runs recorded before either was kept)
    code: NotRequired[str | None]
    sittings: NotRequired[list[str]]


# ----------------------------------------------------------------------------- prompts
def kv_bytes_per_token(model: Path, dtype_bytes: int = 4) -> int:
    """KV cache bytes one token takes in every layer of the model (K and V)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return (
        2
        * cfg["num_hidden_layers"]
        * cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        * head_dim
        * dtype_bytes
    )


def local_pool_tokens(config: ServeConfig, model: Path) -> int:
    """Tokens the local KV pool of a replica holds (``VLLM_CPU_KVCACHE_SPACE`` GiB; plain vLLM gets the same)."""
    gib = int(deploy_config.application(config).env_vars.get(KV_CACHE_SPACE, ENGINE_ENV[KV_CACHE_SPACE]))
    return gib * 2**30 // kv_bytes_per_token(model)


def prompt_plan(workload: Workload, pairs: int, seed: int, pool_tokens: int) -> dict[tuple[int, str], PromptSet]:
    """Every prompt set of the benchmark, from one book: (pair, "warmup" or a run label) -> its set.

    Both arms of a pair send the same sets (identical requests); no set shares a prompt with another."""
    book = PromptBook(seed)
    plan: dict[tuple[int, str], PromptSet] = {}
    for p in range(pairs):
        plan[p, "warmup"] = book.unique(f"pair{p}-warmup", workload.warmup_prompts, workload.input_len)
        for label, c in workload.runs():
            if workload.name == "cold":
                n = workload.chat[c] if is_chat(label) else workload.requests[c]
                plan[p, label] = book.unique(f"pair{p}-{label}", n, workload.input_len)
            else:
                w = float(label[2:-1])
                prefixes = max(1, round(w * pool_tokens / (workload.prefix_blocks * BLOCK_TOKENS)))
                plan[p, label] = book.reuse(
                    f"pair{p}-{label}", prefixes, workload.prefix_blocks, workload.suffix_tokens, workload.rounds
                )
    problems = check_disjoint(plan.values())
    if problems:
        raise ProtocolError("prompt sets overlap: " + "; ".join(problems))
    return plan


# ----------------------------------------------------------------------------- the client
def is_chat(label: str) -> bool:
    """Whether a run label is a chat completions run."""
    return label.startswith(CHAT_PREFIX)


def bench_argv(
    base_url: str,
    tokenizer: Path,
    concurrency: int,
    dataset: Path,
    requests: int,
    output_len: int,
    result_dir: Path,
    result_file: str,
    request_rate: float | None = None,
    chat: bool = False,
) -> list[str]:
    """``vllm bench serve`` arguments (all vLLM's own) for one run over a ``custom`` dataset file, in file order:
    streamed completions, or (``chat``) streamed chat completions, each prompt one user message."""
    rate = ["--request-rate", f"{request_rate:g}"] if request_rate is not None else []
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if chat else ("openai", "/v1/completions")
    return [
        sys.executable,
        "-m",
        "benchmarks.harness.vllm_bench_serve",
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--endpoint",
        endpoint,
        "--model",
        MODEL_NAME,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--custom-output-len",
        str(output_len),
        "--skip-chat-template",
        "--disable-shuffle",
        "--no-oversample",
        "--ignore-eos",
        "--temperature",
        "0",
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(requests),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
        "--disable-tqdm",
        *rate,
    ]


def run_client(
    argv: list[str], result: Path, sched: str = client_priority.NORMAL
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """Run the client under ``sched`` (:mod:`benchmarks.harness.client_priority`); return (its result JSON, CPU
    seconds per role and seconds per role its threads waited for a core, from its main run's start to its
    results). Raises if the client ran with other scheduling."""
    from benchmarks.harness import cpu_accounting

    env = {**os.environ, **ENGINE_ENV, client_priority.ENV: sched}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    before = after = None  # (CPU, waits) snapshots at the main run's start and at its results
    ran_with = None
    tail: list[str] = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        tail = ([*tail, line])[-60:]
        if ran_with is None and SCHED_LINE in line:
            ran_with = line.split(SCHED_LINE, 1)[1].strip()
        elif before is None and "Starting main benchmark run" in line:
            before = cpu_accounting.snapshots(proc.pid)
        elif before is not None and after is None and "Serving Benchmark Result" in line:
            after = cpu_accounting.snapshots(proc.pid)
    proc.wait()
    if proc.returncode != 0 or before is None or after is None:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{''.join(tail)}")
    if ran_with != client_priority.apply_result(sched):
        raise ProtocolError(f"the client was to run with {sched} scheduling but reported {ran_with!r}")
    (cpu_before, waits_before), (cpu_after, waits_after) = before, after
    cpu, waited = cpu_accounting.delta(cpu_before, cpu_after), cpu_accounting.delta(waits_before, waits_after)
    return json.loads(result.read_text()), cpu, waited


def summarize_run(
    stack: str,
    pair: int,
    label: str,
    concurrency: int,
    data: dict[str, Any],
    roles: dict[str, float],
    sampler: HostCpuSampler | None,
    waited: dict[str, float] | None = None,
) -> Run:
    """A :class:`Run` from the client's result and the host's CPU over its measured window."""
    from benchmarks.harness import cpu_accounting

    starts, latencies = data["start_times"], data["latencies"]
    done = [
        (s, s + lat)
        for s, lat, err in zip(starts, latencies, data.get("errors") or [""] * len(starts), strict=False)
        if lat and not err
    ]
    t0, t1 = min(s for s, _ in done), max(e for _, e in done)
    busy = sampler.busy_between(t0, t1) if sampler is not None else float("nan")
    steal = sampler.steal_between(t0, t1) if sampler is not None else float("nan")
    n = data["completed"]

    def pct(name: str) -> RunPercentiles:
        return {
            "p50": data.get(f"median_{name}_ms"),
            "p99": data.get(f"p99_{name}_ms"),
            "mean": data.get(f"mean_{name}_ms"),
        }

    return Run(
        stack=stack,
        pair=pair,
        label=label,
        concurrency=concurrency,
        completed=n,
        failed=data.get("failed", 0),
        duration_s=data["duration"],
        req_per_s=data["request_throughput"],
        output_tok_per_s=data["output_throughput"],
        ttft_ms=pct("ttft"),
        tpot_ms=pct("tpot"),
        itl_ms=pct("itl"),
        e2el_ms=pct("e2el"),
        window_s=t1 - t0,
        host_cpu_s=busy,
        host_cpu_s_per_request=busy / n,
        host_busy_cores=busy / (t1 - t0),
        host_steal_cores=steal / (t1 - t0),
        roles_ms_per_request=cpu_accounting.per_request(roles, n) if roles else {},
        roles_wait_ms_per_request=cpu_accounting.per_request(waited, n) if waited else {},
    )


def void_reason(workload: str, counters: CacheCounters, run: Run | None = None) -> str | None:
    """Why a run cannot count: any failed request, a stall (TTFT p99 over :data:`STALL_P99_OVER_P50` x p50),
    or a cold run that the server served any prompt token of from a cache."""
    if run is not None and run.failed:
        return f"{run.failed} failed request(s)"
    if run is not None:
        p50, p99 = run.ttft_ms["p50"], run.ttft_ms["p99"]
        if p50 is None or p99 is None:
            raise ValueError(f"pair {run.pair} {run.stack} {run.label}: the client's result has no TTFT p50 or p99")
        if p99 > STALL_P99_OVER_P50 * p50:
            return f"stalled: TTFT p99 {p99:.0f} ms is over {STALL_P99_OVER_P50:g}x its p50 ({p50:.0f} ms)"
    server = (run.counters.get("latency_mean_ms") or {}).get("server_ttft") if run is not None else None
    client = run.ttft_ms.get("mean") if run is not None else None
    if (
        run is not None
        and parse_arm(run.stack)[0] in REFERENCE_ARMS
        and server
        and client is not None
        and client > STALL_OUTSIDE_X * server
        and client - server > STALL_OUTSIDE_MS
    ):
        return (
            f"stalled outside the engine: client TTFT mean {client:.0f} ms, the server's own {server:.0f} ms "
            f"(its frontend or the client starved)"
        )
    if workload == "cold" and counters.hit_tokens > 0:
        return (
            f"cold run with cache hits: {counters.prefix_cache_hits:.0f} prompt tokens from the prefix cache, "
            f"{counters.external_hits:.0f} from the offload tier"
        )
    return None


# ----------------------------------------------------------------------------- comparison
def counted(runs: list[Run]) -> list[Run]:
    """The runs that count: not void, and one per pair, arm and run label (a phase run again after a void run
    measures every label again; its latest valid run of each counts, as in the pair ratios)."""
    return list({(r.pair, r.stack, r.label): r for r in runs if r.void is None}.values())


class Comparison(TypedDict):
    """Two arms at one run label, over the pairs where both have a valid run: each figure's pair ratios
    (candidate / reference), the host-speed marker's, and the requests completed and failed by each arm over those
    pairs."""

    candidate: str
    reference: str
    figures: dict[str, pair_stats.PairRatio]
    speed_marker: pair_stats.PairRatio | None  # SPEED_MARKER's ratio: did the pair's arms meet the same host speed
    requests: dict[str, int]
    failed: dict[str, int]


def speed_marker(pairs: list[tuple[Run, Run]]) -> pair_stats.PairRatio | None:
    """:data:`SPEED_MARKER` candidate / reference over ``pairs`` of (reference, candidate) runs; None where a run
    recorded no client CPU."""
    values = [(r.figure(SPEED_MARKER), c.figure(SPEED_MARKER)) for r, c in pairs]
    if not values or any(v <= 0 for pair in values for v in pair):
        return None
    return pair_stats.median_ratio(values)


def compare(runs: list[Run], reference: str = REFERENCE) -> dict[str, dict[str, Comparison]]:
    """Per run label and arm pair (candidate vs reference): each figure's median pair ratio and interval.

    Arm pairs: every arm against ``reference``, ``shipped`` against ``engine`` (what the Serve path costs) and
    against ``stock`` (the peer). Void runs count nowhere."""
    out: dict[str, dict[str, Comparison]] = {}
    arms = list(dict.fromkeys(r.stack for r in runs))
    comparisons = [(a, reference) for a in arms if a != reference and reference in arms]
    if reference not in arms and arms:  # a lever's A/B (e.g. shipped against shipped+VAR=1): against the first arm
        comparisons = [(a, arms[0]) for a in arms[1:]]
    for ref in ("engine", "stock"):
        if "shipped" in arms and ref in arms:
            comparisons.append(("shipped", ref))
    for label in dict.fromkeys(r.label for r in runs):
        by = {(r.pair, r.stack): r for r in counted(runs) if r.label == label}
        out[label] = {}
        for cand, ref in comparisons:
            pairs = sorted({p for p, _ in by if (p, cand) in by and (p, ref) in by})
            if not pairs:
                continue
            out[label][f"{cand}/{ref}"] = {
                "candidate": cand,
                "reference": ref,
                "figures": {
                    f: pair_stats.median_ratio([(by[p, ref].figure(f), by[p, cand].figure(f)) for p in pairs])
                    for f in FIGURES
                },
                "speed_marker": speed_marker([(by[p, ref], by[p, cand]) for p in pairs]),
                "requests": {s: sum(by[p, s].completed for p in pairs) for s in (ref, cand)},
                "failed": {s: sum(by[p, s].failed for p in pairs) for s in (ref, cand)},
            }
    return out


HitKey = Literal["requests", "prompt_tokens", "prefix_cache_hits", "external_hits"]
HIT_KEYS: tuple[HitKey, ...] = ("requests", "prompt_tokens", "prefix_cache_hits", "external_hits")


def hits_by_arm(runs: list[Run]) -> dict[str, dict[str, dict[HitKey, float]]]:
    """Per run label and arm: requests and prompt tokens served by each tier, summed over the arm's runs."""
    out: dict[str, dict[str, dict[HitKey, float]]] = {}
    for r in runs:
        c = r.counters
        slot = out.setdefault(r.label, {}).setdefault(r.stack, dict.fromkeys(HIT_KEYS, 0.0))
        for k in HIT_KEYS:
            slot[k] += c.get(k, 0.0) or 0.0
    return out


SplitPart = Literal["client", "server", "queue", "prefill", "outside", "handoffs"]
SPLIT_PARTS: tuple[SplitPart, ...] = ("client", "server", "queue", "prefill", "outside", "handoffs")


def ttft_split(runs: list[Run]) -> dict[str, dict[str, dict[SplitPart, float | None]]]:
    """Per run label and arm: where the time to first token went, in ms, each part the median over the arm's
    (non-void) runs of that run's mean.

    ``client``: vLLM's bench (request sent until first token received); ``server``: the server's own
    ``vllm:time_to_first_token_seconds`` (arrival at ``AsyncLLM`` until the frontend has the token); ``queue``
    and ``prefill``: EngineCore's (:mod:`benchmarks.harness.server_counters`). Derived: ``outside`` = client - server
    (HTTP, parsing, the guard; HAProxy and Ray's streaming on the shipped stack) and ``handoffs`` = server -
    queue - prefill (frontend to EngineCore and back). A part a server does not time is None."""
    import statistics

    out: dict[str, dict[str, dict[SplitPart, float | None]]] = {}
    for label in dict.fromkeys(r.label for r in runs):
        for arm in dict.fromkeys(r.stack for r in runs):
            mine = [r for r in counted(runs) if r.label == label and r.stack == arm]
            if not mine:
                continue
            per_run: list[dict[SplitPart, float | None]] = []
            for r in mine:
                means = r.counters.get("latency_mean_ms") or {}
                client, server = r.ttft_ms.get("mean"), means.get("server_ttft")
                queue, prefill = means.get("queue"), means.get("prefill")
                per_run.append(
                    {
                        "client": client,
                        "server": server,
                        "queue": queue,
                        "prefill": prefill,
                        "outside": client - server if client is not None and server is not None else None,
                        "handoffs": (
                            server - queue - prefill
                            if server is not None and queue is not None and prefill is not None
                            else None
                        ),
                    }
                )
            out.setdefault(label, {})[arm] = {
                k: (statistics.median(vals) if (vals := [v for row in per_run if (v := row[k]) is not None]) else None)
                for k in SPLIT_PARTS
            }
    return out


class GoalRow(TypedDict):
    """One goal (:class:`Goal`, its fields in order) at one run label: the ratio, its interval and the verdict."""

    run: str
    goal: str
    candidate: str
    reference: str
    figure: str
    ratio: float
    higher_is_better: bool
    median: float
    ci90: list[float]
    pairs: int
    verdict: pair_stats.GoalVerdict


def goals(ratios: dict[str, dict[str, Comparison]]) -> list[GoalRow]:
    """Every goal of :data:`GOALS` at every run label where both its arms ran: the ratio, its interval, and
    ``met`` / ``not met`` (:func:`benchmarks.harness.pair_stats.goal_verdict`)."""
    out: list[GoalRow] = []
    for label, comps in ratios.items():
        for g in GOALS:
            comp = comps.get(f"{g.candidate}/{g.reference}")
            if comp is None:
                continue
            fig = comp["figures"][g.figure]
            out.append(
                {
                    "run": label,
                    "goal": g.text(),
                    "candidate": g.candidate,
                    "reference": g.reference,
                    "figure": g.figure,
                    "ratio": g.ratio,
                    "higher_is_better": g.higher_is_better,
                    "median": fig["median"],
                    "ci90": fig["ci90"],
                    "pairs": fig["pairs"],
                    "verdict": pair_stats.goal_verdict(fig["median"], fig["ci90"], g.ratio, g.higher_is_better),
                }
            )
    return out


ARM_FIGURES = ("req_per_s", "ttft_p50", "ttft_p99", "e2el_p50", "host_cpu_s_per_request", "host_busy_cores")


class ArmFigures(TypedDict):
    """One arm at one run label: each of :data:`ARM_FIGURES`' median over its counted runs (None: no valid run),
    how many runs counted and how many were void."""

    req_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    e2el_p50: float | None
    host_cpu_s_per_request: float | None
    host_busy_cores: float | None
    runs: int
    void: int


def arm_figures(runs: list[Run]) -> dict[str, dict[str, ArmFigures]]:
    """Per run label and arm, each figure's median over the arm's counted runs (:func:`counted`; absolute, so
    hosts compare), and how many of its runs were void."""
    import statistics

    out: dict[str, dict[str, ArmFigures]] = {}
    for label in dict.fromkeys(r.label for r in runs):
        for arm in dict.fromkeys(r.stack for r in runs):
            void = sum(1 for r in runs if r.label == label and r.stack == arm and r.void is not None)
            valid = [r for r in counted(runs) if r.label == label and r.stack == arm]
            if not valid and not void:
                continue
            med = {f: (statistics.median(r.figure(f) for r in valid) if valid else None) for f in ARM_FIGURES}
            out.setdefault(label, {})[arm] = {
                "req_per_s": med["req_per_s"],
                "ttft_p50": med["ttft_p50"],
                "ttft_p99": med["ttft_p99"],
                "e2el_p50": med["e2el_p50"],
                "host_cpu_s_per_request": med["host_cpu_s_per_request"],
                "host_busy_cores": med["host_busy_cores"],
                "runs": len(valid),
                "void": void,
            }
    return out


# ----------------------------------------------------------------------------- report
def _ci(fig: pair_stats.PairRatio) -> str:
    return f"{fig['median']:.2f}x [{fig['ci90'][0]:.2f}, {fig['ci90'][1]:.2f}]"


def markdown(meta: Meta, runs: list[Run], ratios: dict[str, dict[str, Comparison]]) -> str:
    lines = [
        f"# {meta['workload']['name']} workload: {', '.join(meta['workload']['arms'])} ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Host: {meta['machine']}.",
        "",
        *(
            [f"Sittings (a stopped run resumed): {', '.join(meta['sittings'])}.", ""]
            if len(meta.get("sittings", [])) > 1
            else []
        ),
        f"Workload: {json.dumps(meta['workload'])}.",
        "",
    ]
    if meta.get("below_protocol"):
        lines += [f"**Below protocol**: {meta['below_protocol']}", ""]
    ratios_goals = goals(ratios)
    if ratios_goals:
        lines += [
            (
                f"Goals (met: the median on the goal's side and the whole 90 % interval within "
                f"{pair_stats.GOAL_MARGIN:g} of the goal; anything else: not met):"
            ),
            "",
            "| run | goal | ratio [90 % interval] | pairs | verdict |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {g['run']} | {g['goal']} | {g['median']:.2f}x [{g['ci90'][0]:.2f}, {g['ci90'][1]:.2f}] | "
            f"{g['pairs']} | **{g['verdict']}** |"
            for g in ratios_goals
        ]
        lines.append("")
    lines += [
        (
            "Each arm's own figures (the median over its valid runs; busy cores: host CPU seconds over the "
            "client's window, /proc/stat; void: runs that count nowhere):"
        ),
        "",
        (
            "| run | arm | req/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms | host CPU ms/request | busy cores "
            "| runs | void |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def _f(v: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
        return "-" if v is None else format(v * scale, fmt)

    for label, arms in arm_figures(runs).items():
        for arm, f in arms.items():
            lines.append(
                f"| {label} | {arm} | {_f(f['req_per_s'])} | {_f(f['ttft_p50'])} | {_f(f['ttft_p99'])} | "
                f"{_f(f['e2el_p50'])} | {_f(f['host_cpu_s_per_request'], 1000)} | "
                f"{_f(f['host_busy_cores'], fmt='.2f')} | {f['runs']} | {f['void']} |"
            )
    lines.append("")
    lines += [
        "Each cell: the median over pairs of the ratio candidate / reference, [bootstrap 90 % interval].",
        "",
        "| run | arms | pairs | requests (ref / cand) | " + " | ".join(FIGURES.values()) + f" | {SPEED_MARKER_TITLE} |",
        "|---|---|---|---|" + "---|" * (len(FIGURES) + 1),
    ]
    for label, comps in ratios.items():
        for name, comp in comps.items():
            ref, cand = comp["reference"], comp["candidate"]
            figs = comp["figures"]
            lines.append(
                f"| {label} | {name} | {figs['req_per_s']['pairs']} | {comp['requests'][ref]} / "
                f"{comp['requests'][cand]} ({comp['failed'][ref]} / {comp['failed'][cand]} failed) | "
                + " | ".join(_ci(figs[f]) for f in FIGURES)
                + f" | {_ci(marker) if (marker := comp.get('speed_marker')) else '-'} |"
            )
    lines += [
        "",
        "Prompt tokens served from cache, per arm (summed over its runs; the servers' own counters):",
        "",
        (
            "| run | arm | requests | prompt tokens | local prefix cache hits | offload tier hits | "
            "offload hits per request |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for label, hits in hits_by_arm(runs).items():
        for arm, h in hits.items():
            per = h["external_hits"] / h["requests"] if h["requests"] else 0.0
            lines.append(
                f"| {label} | {arm} | {h['requests']:.0f} | {h['prompt_tokens']:.0f} | "
                f"{h['prefix_cache_hits']:.0f} | {h['external_hits']:.0f} | {per:.1f} |"
            )
    lines += [
        "",
        (
            "Where the time to first token goes, per arm (ms; each part the median over the arm's runs of the "
            "run's mean; `server`, `queue`, `prefill` from the server's own histograms, `outside` = client - "
            "server: HTTP, parsing, guard, HAProxy and Ray's streaming; `hand-offs` = server - queue - prefill: "
            "frontend to EngineCore and back):"
        ),
        "",
        "| run | arm | client TTFT | server TTFT | queue | prefill | outside | hand-offs |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def _ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for label, splits in ttft_split(runs).items():
        for arm, part in splits.items():
            lines.append(f"| {label} | {arm} | " + " | ".join(_ms(part[k]) for k in SPLIT_PARTS) + " |")
    lines += [
        "",
        (
            "Every run (vLLM's `bench serve` figures; host CPU from /proc/stat over the client's measured "
            "window, steal apart: *stolen cores* is what the hypervisor took, a host-speed marker; cache hits "
            "from the server):"
        ),
        "",
        (
            "| pair | arm | run | conc. | completed | failed | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | "
            "host CPU ms/request | busy cores | stolen cores | hits local / offload | void | CPU ms/request by role | "
            "waited for a core ms/request by role |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        roles = ", ".join(f"{k} {v:.1f}" for k, v in r.roles_ms_per_request.items())
        waits = ", ".join(f"{k} {v:.1f}" for k, v in r.roles_wait_ms_per_request.items()) or "-"
        c = r.counters
        lines.append(
            f"| {r.pair} | {r.stack} | {r.label} | {r.concurrency} | {r.completed} | {r.failed} | "
            f"{r.req_per_s:.1f} | {r.ttft_ms['p50']:.0f} / {r.ttft_ms['p99']:.0f} | "
            f"{r.tpot_ms['p50']:.1f} / {r.tpot_ms['p99']:.1f} | {1000 * r.host_cpu_s_per_request:.1f} | "
            f"{r.host_busy_cores:.2f} | {'-' if r.host_steal_cores is None else format(r.host_steal_cores, '.2f')} | "
            f"{c.get('prefix_cache_hits', 0):.0f} / {c.get('external_hits', 0):.0f} "
            f"| {r.void or ''} | {roles} | {waits} |"
        )
    lines += ["", "Protocol: " + "; ".join(meta["protocol"]), ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r.label for r in runs))
    arms = list(dict.fromkeys(r.stack for r in runs))
    colors = dict(
        zip(ARMS, ("tab:blue", "tab:orange", "tab:green", "tab:brown", "tab:red", "tab:purple"), strict=False)
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (metric, label, scale) in zip(
        axes,
        (
            ("req_per_s", "requests/s", 1),
            ("ttft_p50", "TTFT p50 ms", 1),
            ("host_cpu_s_per_request", "host CPU ms per request", 1000),
        ),
        strict=False,
    ):
        for k, arm in enumerate(arms):
            for i, lab in enumerate(labels):
                ys = [r.figure(metric) * scale for r in runs if r.stack == arm and r.label == lab and r.void is None]
                xs = [i + (k - (len(arms) - 1) / 2) * 0.15] * len(ys)
                ax.scatter(xs, ys, color=colors.get(arm), label=arm if i == 0 else None, s=14)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("vLLM bench serve, each run: " + ", ".join(arms))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine() -> str:
    import platform

    import psutil

    return (
        f"{cpu_model()}, {platform.machine()}, {psutil.cpu_count(logical=True)} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The host's CPU model as /proc/cpuinfo names it ("unknown CPU" where it does not)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown CPU"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown CPU"


# ----------------------------------------------------------------------------- driver
class PhaseTarget(Protocol):
    """What a phase sends its runs to: a started arm (:mod:`benchmarks.harness.arms`), or one application of a
    shared cluster (:mod:`benchmarks.investigations.interleaved`)."""

    base_url: str
    metrics_urls: list[str]

    def check(self, when: str) -> None: ...


def run_phase(
    arm: PhaseTarget,
    stack: str,
    pair: int,
    workload: Workload,
    plan: dict[tuple[int, str], PromptSet],
    model: Path,
    work: Path,
    sampler: HostCpuSampler,
    attempt: int = 0,
    baseline: CacheCounters | None = None,
) -> list[Run]:
    """The warm-up and every measured run of one started arm; ``baseline``: the server's counters before the
    warm-up (None: a fresh server, all zero; an arm sharing a cluster that served before passes what it read)."""
    runs: list[Run] = []
    warm = plan[pair, "warmup"]
    warmed = 0
    # the warm-up at each concurrency the runs use, in turn: a batch shape first met in a measured run (vLLM
    # compiles per shape on CPU) would be timed there
    for i, (label, c) in enumerate(workload.runs()):
        part = PromptSet(f"{warm.name}-{label}", warm.prompts[i :: len(workload.runs())], "unique")
        if not len(part):
            continue
        name = f"warmup-{pair}-{slug(stack)}-{attempt}-{label}.json"
        data, _, _ = run_client(
            bench_argv(
                arm.base_url,
                model,
                c,
                part.write_jsonl(work / "prompts" / f"{part.name}.jsonl"),
                len(part),
                workload.output_len,
                work,
                name,
                chat=is_chat(label),
            ),
            work / name,
            workload.client_sched,
        )
        warmed += int(data["completed"])
    # the warm-up's requests must be counted before the first measured run's baseline
    settled = wait_for_requests(arm.metrics_urls, baseline or CacheCounters(), warmed)
    for label, c in workload.runs():
        prompts = plan[pair, label]
        arm.check(f"pair {pair} before the {label} run")
        name = f"{slug(stack)}-{pair}-{attempt}-{label}.json"
        data, roles, waited = run_client(
            bench_argv(
                arm.base_url,
                model,
                c,
                prompts.write_jsonl(work / "prompts" / f"{prompts.name}.jsonl"),
                len(prompts),
                workload.output_len,
                work,
                name,
                workload.request_rate,
                chat=is_chat(label),
            ),
            work / name,
            workload.client_sched,
        )
        arm.check(f"pair {pair} after the {label} run")
        after = wait_for_requests(arm.metrics_urls, settled, int(data["completed"]))
        counters, settled = after - settled, after
        run = summarize_run(stack, pair, label, c, data, roles, sampler, waited)
        run.prompts, run.counters, run.attempt = prompts.describe(), counters.to_json(), attempt
        run.void = void_reason(workload.name, counters, run)
        runs.append(run)
        log.info(
            "pair %d %s %s: %.1f req/s, TTFT p50 %.0f ms, %.1f host CPU ms/request (%d completed, %d failed); "
            "hits: %.0f local, %.0f offload%s",
            pair,
            stack,
            label,
            run.req_per_s,
            run.ttft_ms["p50"],
            1000 * run.host_cpu_s_per_request,
            run.completed,
            run.failed,
            counters.prefix_cache_hits,
            counters.external_hits,
            f"; VOID: {run.void}" if run.void else "",
        )
    return runs


def parse_requests(text: str) -> dict[int, int]:
    """``"1:128,8:400"`` -> {1: 128, 8: 400}."""
    out: dict[int, int] = {}
    for part in text.split(","):
        c, n = part.split(":")
        out[int(c)] = int(n)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.vs_vllm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    args = ap.parse_args(argv)
    command_logging()
    stop_on_term()  # a stopped run (SIGTERM) unwinds like Ctrl-C: what it started is stopped
    use_engine_env()
    pair_stats.check_pairs(args.pairs, smoke=args.smoke)
    arms = split_arms(args.arms or DEFAULT_ARMS[args.workload])
    for a in arms:
        try:
            parse_arm(a)
        except ValueError as e:
            ap.error(str(e))
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
    require_no_ray("before the benchmark")
    from fixture_model.build import ensure_model

    model = ensure_model()
    config = load_config(args.config)
    plan = prompt_plan(workload, args.pairs, args.seed, local_pool_tokens(config, model))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-vs-vllm-"))
    log.info("server and cluster logs, prompts, raw client results in %s", work)
    meta: Meta = {
        "command": "python -m benchmarks.vs_vllm " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "code": resume.code_version(),
        "workload": {
            **asdict(workload),
            "runs": workload.runs(),
            "arms": arms,
            "pairs": args.pairs,
            "seed": args.seed,
            "local_pool_tokens": local_pool_tokens(config, model),
            "engine_kwargs": model_config(config).engine_kwargs,
            "client": "vllm bench serve (vllm.benchmarks.serve), custom dataset in file order, "
            "greedy, streamed completions (chat runs: openai-chat, streamed chat completions)",
        },
        "protocol": [
            f"{len(plan)} prompt sets, no prompt in two of them (checked)",
            f"the client on {client_priority.apply_result(workload.client_sched)} scheduling, every run (checked)"
            + (f"; {args.client_sched} was asked: {sched_refused}" if sched_refused else ""),
        ],
        "replicas": {},
        "below_protocol": (
            f"{args.pairs} pairs (the protocol takes at least {pair_stats.MIN_PAIRS})"
            if args.pairs < pair_stats.MIN_PAIRS
            else None
        ),
    }
    meta["workload"]["requests"] = {str(k): v for k, v in workload.requests.items()}
    meta["workload"]["chat"] = {str(k): v for k, v in workload.chat.items()}
    meta["sittings"] = [meta["date"]]
    labels = [label for label, _ in workload.runs()]
    recorded: list[dict[str, Any]] = []  # a resumed run's runs, as recorded
    done: set[tuple[int, str]] = set()
    if args.resume:
        try:
            previous = resume.load(args.out)
            resume.check_same(previous["meta"], dict(meta))
        except resume.ResumeRefused as e:
            ap.error(f"--resume: {e}")
        recorded, done = previous["runs"], resume.done_phases(previous["runs"], labels, arms)
        kept: Meta = previous["meta"]
        kept.setdefault("sittings", [kept["date"]]).append(meta["date"])
        kept["protocol"] += [
            (
                f"resumed {meta['date']} by `{meta['command']}`: {len(done)} of {len(arms) * args.pairs} phases "
                "kept from the earlier sitting(s)"
            ),
            *meta["protocol"],
        ]
        meta = kept
        log.info("resuming %s: %d phase(s) kept", args.out / "vs_vllm.json", len(done))
    runs: list[Run] = [Run(**r) for r in recorded]
    with HostCpuSampler() as sampler:
        for pair, stack in pair_stats.block_order(arms, args.pairs):
            if (pair, stack) in done:
                log.info("pair %d: %s kept from an earlier sitting", pair, stack)
                continue
            first = resume.next_attempt(recorded, pair, stack)
            for attempt in range(first, first + 1 + args.retries):
                log.info("pair %d: %s%s", pair, stack, f" (run again: {attempt})" if attempt else "")
                with make_arm(stack, config, model, work / f"{slug(stack)}-{pair}-{attempt}") as arm:
                    meta["replicas"][f"{pair}-{stack}"] = arm.replicas
                    phase = run_phase(arm, stack, pair, workload, plan, model, work, sampler, attempt)
                runs += phase
                on_ray = parse_arm(stack)[0] in RAY_ARMS
                meta["protocol"].append(
                    f"pair {pair} {stack}{f' (run {attempt + 1})' if attempt else ''}: "
                    + (
                        f"{arm.replicas} engine replica(s), cluster torn down, no Ray process left"
                        if on_ray
                        else "no Ray process alive before, during (checked around each run) or after it"
                    )
                )
                write_results(args.out, meta, runs)
                if not any(r.void for r in phase):
                    break
                log.warning(
                    "pair %d %s: %d void run(s)%s",
                    pair,
                    stack,
                    sum(bool(r.void) for r in phase),
                    "; the phase runs again" if attempt < first + args.retries else "; no re-run left",
                )
    plot(runs, args.out / "vs_vllm.png")
    print(markdown(meta, runs, compare(runs)))
    void = [f"pair {r.pair} {r.stack} {r.label} (run {r.attempt + 1}): {r.void}" for r in runs if r.void]
    if void:
        log.warning("%d void run(s), their figures count nowhere:\n  %s", len(void), "\n  ".join(void))
    missing = missing_runs(runs, arms, args.pairs, labels)
    if missing:
        log.error("no valid run after %d re-run(s) for: %s", args.retries, ", ".join(missing))
        return 2
    return 0


RAY_ARMS = ("shipped", "shipped-nooffload", "stock")  # arms that run in a Ray cluster of their own


def missing_runs(runs: list[Run], arms: list[str], pairs: int, labels: list[str]) -> list[str]:
    """Every (pair, arm, run label) with no valid (non-void) run."""
    valid = {(r.pair, r.stack, r.label) for r in counted(runs)}
    return [f"pair {p} {a} {lab}" for p in range(pairs) for a in arms for lab in labels if (p, a, lab) not in valid]


def write_results(out: Path, meta: Meta, runs: list[Run]) -> None:
    """vs_vllm.json and vs_vllm.md as they stand (rewritten after every phase: a stopped run keeps its data)."""
    ratios = compare(runs)
    (out / "vs_vllm.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "ratios": ratios,
                "goals": goals(ratios),
                "arms": arm_figures(runs),
                "ttft_split": ttft_split(runs),
                "runs": [asdict(r) for r in runs],
            },
            indent=1,
        )
    )
    (out / "vs_vllm.md").write_text(markdown(meta, runs, ratios))


if __name__ == "__main__":
    sys.exit(main())
