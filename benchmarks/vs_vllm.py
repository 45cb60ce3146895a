r"""The headline benchmark: the shipped config against plain vLLM, measured the way a user would measure it.

    python -m benchmarks.vs_vllm [--pairs 3] [--concurrency 32,128] [--out docs/benchmarks/vs_vllm]

What a user who weighs this project against plain vLLM would run, and nothing
of ours in the measurement path:

* **plain**: vLLM's own OpenAI server (``python -m
  vllm.entrypoints.openai.api_server``) with vLLM's defaults (compiled where
  the platform allows), the same model, dtype and ``max_model_len`` as the
  shipped config, every patch of ours off (``FUZZSERVE_PATCHES_OFF=all``),
  **alone on the host**: the run refuses to start, and a run is void, while
  any Ray process is alive;
* **shipped**: ``serve_config.yaml`` exactly as ``ray start`` + ``serve
  deploy serve_config.yaml`` runs it (a fresh single-node cluster with
  Ray's own CPU count, the HTTP port moved to a free one), nothing else
  deployed, torn down before the next plain run;
* both driven by **vLLM's own** ``vllm bench serve`` (``vllm.benchmarks.serve``
  through :mod:`benchmarks.vllm_bench_serve`): random dataset, fixed prompt
  and output lengths (``--ignore-eos``), streamed completions, at each
  ``--concurrency``; its throughput, TTFT and TPOT are reported as it
  computes them, over every request it sent (``completed`` and ``failed``
  are in the results);
* **host-wide CPU seconds per request** from /proc/stat over the client's
  measured window (first request sent to last response received, from the
  client's own per-request start times and latencies), every process on the
  host and the kernel's time included (:mod:`benchmarks.host`); CPU per
  process role (:mod:`benchmarks.cpu_accounting`, from the main run's start
  to the client's exit) beside it;
* phases interleaved in pairs, ABBA (plain, shipped, shipped, plain, ...),
  each phase warmed up with ``--warmup-prompts`` unmeasured requests before
  its measured runs; per concurrency the ratio shipped / plain of each pair,
  their median, and a percentile-bootstrap 90 % interval of the median
  (resampling pairs), so "within noise" is a statement with numbers.

Results: ``vs_vllm.json`` (every run, every figure, the protocol checks),
``vs_vllm.md`` (the tables) and ``vs_vllm.png`` in ``--out``, with the
command line that produced them. This is a benchmark, not a test: nothing
here asserts a target (tests/test_vs_vllm.py checks the protocol).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.host import HostCpuSampler, ray_processes
from patches.switches import ALL, OFF_ENV
from serve_app.command_logs import command_logging
from serve_app.engine_env import ENGINE_ENV, use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.vs_vllm")

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "vs_vllm"
MODEL_NAME = "fixture"
# The engine settings the shipped config sets that change what is computed;
# plain vLLM gets the same, everything else is vLLM's default.
PLAIN_ENGINE_ARGS = ("--dtype", "float32", "--max-model-len", "1024")
BOOTSTRAP_SAMPLES = 10_000


class ProtocolError(RuntimeError):
    """The measurement would not be the one this benchmark promises (e.g. Ray alive during a plain run)."""


@dataclass
class Workload:
    input_len: int = 128
    output_len: int = 64
    prompts_per_concurrency: int = 10  # a run sends this many x its concurrency (at least min_prompts)
    # 320 prompts at 32 in flight last ~5 s, where one slow second of the
    # shared host moves a run by 20 %: short runs get at least this many.
    min_prompts: int = 640
    warmup_prompts: int = 300

    def prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.prompts_per_concurrency * concurrency)


@dataclass
class Run:
    """One ``vllm bench serve`` run against one phase."""

    stack: str  # "plain" or "shipped"
    pair: int
    concurrency: int
    completed: int
    failed: int
    duration_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    window_s: float
    host_cpu_s: float
    host_cpu_s_per_request: float
    host_busy_cores: float
    roles_ms_per_request: dict[str, float] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the client
def bench_argv(base_url: str, tokenizer: Path, concurrency: int, prompts: int, seed: int, workload: Workload,
               result_dir: Path, result_file: str) -> list[str]:
    """``vllm bench serve`` arguments (all vLLM's own) for one run."""
    return [sys.executable, "-m", "benchmarks.vllm_bench_serve", "--backend", "openai", "--base-url", base_url,
            "--endpoint", "/v1/completions", "--model", MODEL_NAME, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(workload.input_len),
            "--random-output-len", str(workload.output_len), "--ignore-eos",
            "--max-concurrency", str(concurrency), "--num-prompts", str(prompts), "--seed", str(seed),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(result_dir),
            "--result-filename", result_file, "--disable-tqdm"]


def run_client(argv: list[str], result: Path, sampler: HostCpuSampler | None) -> tuple[dict[str, Any], dict]:
    """Run the client; return (its result JSON, CPU per role) and note the window into the result.

    Role CPU is taken from psutil snapshots when the client prints that its
    main run starts and when it prints its results (still alive, so its own
    CPU is counted as the load generator's).
    """
    from benchmarks import cpu_accounting

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, **ENGINE_ENV})
    before = after = None
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line])[-60:]
        if before is None and "Starting main benchmark run" in line:
            before = cpu_accounting.snapshot(proc.pid)
        elif before is not None and after is None and "Serving Benchmark Result" in line:
            after = cpu_accounting.snapshot(proc.pid)
    proc.wait()
    if proc.returncode != 0 or before is None or after is None:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{''.join(tail)}")
    data = json.loads(result.read_text())
    return data, cpu_accounting.delta(before, after)


def summarize_run(stack: str, pair: int, concurrency: int, data: dict[str, Any], roles: dict[str, float],
                  sampler: HostCpuSampler | None) -> Run:
    """A :class:`Run` from the client's result and the host's CPU over its measured window."""
    from benchmarks import cpu_accounting

    starts, latencies = data["start_times"], data["latencies"]
    done = [(s, s + lat) for s, lat, err in zip(starts, latencies, data.get("errors") or [""] * len(starts))
            if lat and not err]
    t0, t1 = min(s for s, _ in done), max(e for _, e in done)
    busy = sampler.busy_between(t0, t1) if sampler is not None else float("nan")
    n = data["completed"]
    pct = lambda name: {"p50": data.get(f"median_{name}_ms"), "p99": data.get(f"p99_{name}_ms")}  # noqa: E731
    return Run(stack=stack, pair=pair, concurrency=concurrency, completed=n, failed=data.get("failed", 0),
               duration_s=data["duration"], req_per_s=data["request_throughput"],
               output_tok_per_s=data["output_throughput"], ttft_ms=pct("ttft"), tpot_ms=pct("tpot"),
               itl_ms=pct("itl"), window_s=t1 - t0, host_cpu_s=busy, host_cpu_s_per_request=busy / n,
               host_busy_cores=busy / (t1 - t0),
               roles_ms_per_request=cpu_accounting.per_request(roles, n) if roles else {})


# ----------------------------------------------------------------------------- the stacks
def require_no_ray(what: str, find=ray_processes) -> None:
    """Raise :class:`ProtocolError` naming them if any Ray process is alive."""
    alive = find()
    if alive:
        raise ProtocolError(f"{what}: plain vLLM must be measured alone on the host, but Ray processes are alive "
                            f"(stop them: `ray stop`, or `serve shutdown -y && ray stop`):\n  " + "\n  ".join(alive[:20]))


class PlainVllm:
    """vLLM's OpenAI server with its defaults and every patch off, alone on the host."""

    def __init__(self, model: Path, log_dir: Path, find_ray=ray_processes):
        self.model, self.log_dir, self._find_ray = model, log_dir, find_ray
        self.server = None

    def __enter__(self) -> PlainVllm:
        from serve_app.ports import free_port
        from testkit.server_process import ServerProcess

        require_no_ray("before starting plain vLLM", self._find_ray)
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                "--served-model-name", MODEL_NAME, *PLAIN_ENGINE_ARGS, "--host", "127.0.0.1", "--port", str(port)]
        self.server = ServerProcess(argv, f"http://127.0.0.1:{port}/health", log_path=self.log_dir / "plain_vllm.log",
                                    env={**ENGINE_ENV, OFF_ENV: ALL})
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    def check(self, when: str) -> None:
        require_no_ray(when, self._find_ray)

    def __exit__(self, *exc) -> None:
        self.server.close()


class Shipped:
    """``serve_config.yaml`` as ``ray start`` + ``serve deploy`` runs it, in a fresh single-node cluster."""

    def __init__(self, config: Path, log_dir: Path):
        self.config, self.log_dir = config, log_dir

    def __enter__(self) -> Shipped:
        from serve_app.local_cluster import LocalCluster
        from serve_app.ports import free_port

        # num_cpus=None: Ray counts the host's cores, as a plain `ray start --head` does
        self.cluster = LocalCluster(num_cpus=None, log_dir=self.log_dir)
        self.cluster.start()
        try:
            self.cluster.deploy(self.config, http_port=free_port())
            self.replicas = len(self.cluster.replicas())
        except BaseException:
            self.cluster.close()
            raise
        self.base_url = self.cluster.base_url
        return self

    def check(self, when: str) -> None:
        pass

    def __exit__(self, *exc) -> None:
        self.cluster.close()
        left = ray_processes()
        if left:
            raise ProtocolError("the shipped phase's cluster left Ray processes behind:\n  " + "\n  ".join(left))


def phase_order(pairs: int) -> list[tuple[int, str]]:
    """(pair, stack) in ABBA order: plain, shipped, shipped, plain, plain, shipped, ..."""
    order = []
    for p in range(pairs):
        first, second = ("plain", "shipped") if p % 2 == 0 else ("shipped", "plain")
        order += [(p, first), (p, second)]
    return order


# ----------------------------------------------------------------------------- statistics
def median_ratio(pairs: list[tuple[float, float]], samples: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                 ) -> dict[str, Any]:
    """Median of the per-pair ratios shipped / plain and its percentile-bootstrap 90 % interval (pairs resampled)."""
    ratios = [s / p for p, s in pairs]
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(samples))
    return {"pairs": len(ratios), "ratios": ratios, "median": statistics.median(ratios),
            "ci90": [boot[int(0.05 * samples)], boot[int(0.95 * samples) - 1]]}


def compare(runs: list[Run]) -> dict[int, dict[str, Any]]:
    """Per concurrency: the shipped / plain ratios of requests/s and of host CPU per request, pair by pair."""
    out = {}
    for c in sorted({r.concurrency for r in runs}):
        by = {(r.pair, r.stack): r for r in runs if r.concurrency == c}
        pairs = sorted({p for p, s in by if (p, "plain") in by and (p, "shipped") in by})
        if not pairs:
            continue
        out[c] = {
            "req_per_s": median_ratio([(by[p, "plain"].req_per_s, by[p, "shipped"].req_per_s) for p in pairs]),
            "host_cpu_per_request": median_ratio([(by[p, "plain"].host_cpu_s_per_request,
                                                   by[p, "shipped"].host_cpu_s_per_request) for p in pairs]),
            "requests": {s: sum(by[p, s].completed for p in pairs) for s in ("plain", "shipped")},
            "failed": {s: sum(by[p, s].failed for p in pairs) for s in ("plain", "shipped")},
        }
    return out


# ----------------------------------------------------------------------------- report
def markdown(meta: dict[str, Any], runs: list[Run], ratios: dict[int, dict[str, Any]]) -> str:
    lines = [f"# Shipped config vs plain vLLM ({meta['date']})", "", f"Command: `{meta['command']}`", "",
             f"Host: {meta['machine']}. Workload: {meta['workload']}.", "",
             "| concurrency | requests (plain / shipped) | req/s shipped / plain: median [90 % CI] | "
             "host CPU per request shipped / plain: median [90 % CI] | pairs |",
             "|---|---|---|---|---|"]
    for c, r in ratios.items():
        t, cpu = r["req_per_s"], r["host_cpu_per_request"]
        lines.append(f"| {c} | {r['requests']['plain']} / {r['requests']['shipped']} "
                     f"({r['failed']['plain']} / {r['failed']['shipped']} failed) | "
                     f"{t['median']:.2f}x [{t['ci90'][0]:.2f}, {t['ci90'][1]:.2f}] | "
                     f"{cpu['median']:.2f}x [{cpu['ci90'][0]:.2f}, {cpu['ci90'][1]:.2f}] | {t['pairs']} |")
    lines += ["", "Every run (vLLM's `bench serve` figures; host CPU from /proc/stat over the client's measured window):",
              "", "| pair | stack | conc. | completed | failed | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | "
                  "host CPU ms/request | busy cores | CPU ms/request by role |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        roles = ", ".join(f"{k} {v:.1f}" for k, v in r.roles_ms_per_request.items())
        lines.append(f"| {r.pair} | {r.stack} | {r.concurrency} | {r.completed} | {r.failed} | {r.req_per_s:.1f} | "
                     f"{r.ttft_ms['p50']:.0f} / {r.ttft_ms['p99']:.0f} | {r.tpot_ms['p50']:.1f} / "
                     f"{r.tpot_ms['p99']:.1f} | {1000 * r.host_cpu_s_per_request:.1f} | {r.host_busy_cores:.2f} | "
                     f"{roles} |")
    lines += ["", "Protocol: " + "; ".join(meta["protocol"]), ""]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    concs = sorted({r.concurrency for r in runs})
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in ((axes[0], "req_per_s", "requests/s"),
                              (axes[1], "host_cpu_s_per_request", "host CPU ms per request")):
        for stack, marker, color in (("plain", "o", "tab:blue"), ("shipped", "s", "tab:green")):
            for i, c in enumerate(concs):
                ys = [getattr(r, metric) * (1000 if "cpu" in metric else 1) for r in runs
                      if r.stack == stack and r.concurrency == c]
                xs = [i + (-0.1 if stack == "plain" else 0.1)] * len(ys)
                ax.scatter(xs, ys, marker=marker, color=color, label=stack if i == 0 else None)
        ax.set_xticks(range(len(concs)), [f"{c} in flight" for c in concs])
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.suptitle("vLLM bench serve: plain vLLM alone vs the shipped config, each run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def machine() -> str:
    import platform

    import psutil

    return f"{platform.machine()}, {psutil.cpu_count(logical=True)} CPUs, " \
           f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"


# ----------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.vs_vllm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=3, help="interleaved (plain, shipped) pairs, ABBA order")
    ap.add_argument("--concurrency", default="32,128", help="comma-separated: requests in flight (--max-concurrency)")
    ap.add_argument("--prompts-per-concurrency", type=int, default=Workload.prompts_per_concurrency,
                    help="a run sends this many prompts per request in flight (at least --min-prompts)")
    ap.add_argument("--min-prompts", type=int, default=Workload.min_prompts)
    ap.add_argument("--warmup-prompts", type=int, default=Workload.warmup_prompts,
                    help="unmeasured requests at the highest concurrency when a phase starts")
    ap.add_argument("--input-len", type=int, default=Workload.input_len)
    ap.add_argument("--output-len", type=int, default=Workload.output_len)
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml", help="the shipped config")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    command_logging()
    use_engine_env()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    workload = Workload(args.input_len, args.output_len, args.prompts_per_concurrency, args.min_prompts,
                        args.warmup_prompts)
    require_no_ray("before the benchmark")
    from fixture_model.build import ensure_model

    model = ensure_model()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-vs-vllm-"))
    log.info("server and cluster logs, raw client results in %s", work)
    meta = {"command": "python -m benchmarks.vs_vllm " + " ".join(sys.argv[1:] if argv is None else argv),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine(),
            "workload": {**asdict(workload), "concurrency": concurrencies, "pairs": args.pairs,
                         "client": "vllm bench serve (vllm.benchmarks.serve), random dataset, streamed completions"},
            "protocol": [], "replicas": {}}
    runs: list[Run] = []
    with HostCpuSampler() as sampler:
        for pair, stack in phase_order(args.pairs):
            log.info("pair %d: %s", pair, stack)
            phase = (PlainVllm(model, work) if stack == "plain"
                     else Shipped(args.config, work / f"cluster-{pair}"))
            with phase:
                if stack == "shipped":
                    meta["replicas"][pair] = phase.replicas
                seed = 1000 + pair
                if workload.warmup_prompts:
                    warm = work / f"warmup-{pair}-{stack}.json"
                    run_client(bench_argv(phase.base_url, model, max(concurrencies), workload.warmup_prompts, seed,
                                          workload, work, warm.name), warm, None)
                for c in concurrencies:
                    phase.check(f"pair {pair} before the run at {c} in flight")
                    name = f"{stack}-{pair}-c{c}.json"
                    data, roles = run_client(bench_argv(phase.base_url, model, c, workload.prompts(c), pair, workload,
                                                        work, name), work / name, sampler)
                    phase.check(f"pair {pair} after the run at {c} in flight")
                    run = summarize_run(stack, pair, c, data, roles, sampler)
                    runs.append(run)
                    log.info("pair %d %s c=%d: %.1f req/s, %.1f host CPU ms/request (%d completed, %d failed)",
                             pair, stack, c, run.req_per_s, 1000 * run.host_cpu_s_per_request, run.completed,
                             run.failed)
            if stack == "plain":
                meta["protocol"].append(f"pair {pair}: no Ray process alive before, during (checked around each "
                                        "run) or after plain vLLM")
            else:
                meta["protocol"].append(f"pair {pair}: shipped cluster ({meta['replicas'][pair]} engine replicas) "
                                        "torn down, no Ray process left")
            ratios = compare(runs)
            (args.out / "vs_vllm.json").write_text(json.dumps(
                {"meta": meta, "ratios": ratios, "runs": [asdict(r) for r in runs]}, indent=1))
            (args.out / "vs_vllm.md").write_text(markdown(meta, runs, ratios))
    plot(runs, args.out / "vs_vllm.png")
    print(markdown(meta, runs, compare(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
