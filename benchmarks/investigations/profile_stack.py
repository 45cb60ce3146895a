"""Where the time goes, per function: py-spy on every Python process of a serving stack under the serve_stack workload.

    python -m benchmarks.investigations.profile_stack [--targets a,fb] [--requests 400] [--concurrency 32] [--rate 100]
                                       [--out docs/benchmarks]

``serve_stack`` says *which process* spends the CPU (psutil, per role); this
says *which code* inside it, and why the same EngineCore costs more per
request under one server than under another. For each target it

1. starts the target (``a``: vLLM's OpenAI server; any other serve_stack
   target: its application on its own local Ray cluster) and warms it up;
2. attaches ``py-spy record`` (sampling, ``--nonblocking``: the target is
   never paused) to each of the target's titled processes: the HTTP
   frontend (API server / engine replica), EngineCore and its worker (on
   CPU vLLM always runs the model in a worker child), the ingress replica
   and Serve's proxy actor where the target has them (HAProxy is native code
   and not sampled);
3. drives the serve_stack workload (same prompts, concurrency, streaming)
   and reads, besides the samples, CPU seconds per process role (psutil)
   and the engine's steps (vLLM's ``iteration_tokens`` histogram: steps and
   tokens per step, from the server's or Ray's metrics endpoint);
4. folds each sampled stack into one category by its innermost frame that
   names one (model forward, scheduler, KV offloading, IPC, HTTP, ...).

Results: ``profile_stack.json`` (everything, top functions included),
``profile_stack.md`` (tables) and ``profile_stack.png`` (ms per request by
category, per target and process) in ``--out``. py-spy's own sampling costs
some CPU on a 2-core host, the same for every target; absolute ms are
inflated a little, comparisons between targets are not.

This is a benchmark, not a test: nothing here asserts a target.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_tests.command_logs import command_logging
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, replica_class_prefix, replica_id
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.profile")

REPO = Path(__file__).resolve().parents[2]
PY_SPY = Path(sys.executable).parent / "py-spy"

# Category of a sampled stack: the innermost frame whose "function (file:line)"
# text contains one of a category's patterns decides. Order only matters for a
# frame that matches several categories (the first listed wins).
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("fuzzserve patches", ("/patches/",)),
    ("fuzzserve app", ("/serve_app/",)),
    # EngineCore and its worker pass each step through a shared-memory ring
    # buffer and spin (sched_yield) for up to 1 s after a read before sleeping.
    ("shm ring buffer wait (spin or nap)", ("shm_broadcast", "sched_yield")),
    ("KV offloading", ("kv_offload", "kv_connector", "offloading_connector")),
    ("attention / KV ops", ("/attention/", "_custom_ops", "cpu_attn")),
    ("model forward", ("/model_executor/", "torch/nn/", "torch/_ops", "torch/functional")),
    ("sampling", ("/v1/sample/",)),
    ("model runner", ("/v1/worker/", "/v1/executor/")),
    ("scheduler / KV cache manager", ("/v1/core/",)),
    ("IPC (ZMQ, msgpack)", ("zmq/", "serial_utils", "msgspec", "msgpack")),
    ("metrics / logging", ("/metrics/", "prometheus", "/logging/", "ray/util/metrics")),
    ("tokenizer / detokenizer", ("tokeniz", "detokenizer", "/transformers_utils/")),
    ("output processing", ("output_processor", "/v1/engine/async_llm", "/outputs.py")),
    ("engine core loop", ("/v1/engine/",)),
    ("OpenAI serving (vLLM entrypoints)", ("/vllm/entrypoints/",)),
    ("ray.serve.llm", ("ray/llm/",)),
    ("Ray Serve / Ray core", ("ray/serve/", "ray/_private/", "ray/_raylet", "ray/actor", "ray/remote_function")),
    ("HTTP (uvicorn, starlette, fastapi)", ("uvicorn", "starlette", "fastapi", "h11", "httptools", "aiohttp")),
    ("pydantic", ("pydantic",)),
    ("asyncio event loop", ("asyncio/", "uvloop")),
]
OTHER = "other"


# ----------------------------------------------------------------------------- py-spy's collapsed stacks
def read_collapsed(text: str) -> collections.Counter:
    """py-spy ``--format raw`` (one ``frame;frame;... count`` per line, outermost first) -> {frames: samples}.

    Thread and process prefixes (``--threads``, ``--subprocesses``) are dropped.
    """
    out: collections.Counter = collections.Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = tuple(f for f in stack.split(";") if f and not f.startswith(("thread (", "process ")))
        out[frames] += int(count)
    return out


def category(frames: tuple[str, ...]) -> str:
    for frame in reversed(frames):  # innermost first
        for name, patterns in CATEGORIES:
            if any(p in frame for p in patterns):
                return name
    return OTHER


def by_category(stacks: collections.Counter) -> dict[str, int]:
    out: collections.Counter = collections.Counter()
    for frames, n in stacks.items():
        out[category(frames) if frames else OTHER] += n
    return dict(out.most_common())


def _short(frame: str) -> str:
    """``fn (/long/path/site-packages/vllm/x.py:12)`` -> ``fn (vllm/x.py:12)``."""
    m = re.match(r"(.*) \((.*)\)$", frame)
    if not m:
        return frame
    fn, where = m.groups()
    for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    return f"{fn} ({where})"


def top_functions(stacks: collections.Counter, n: int = 15, inclusive: bool = False) -> list[tuple[str, int]]:
    """The ``n`` functions with the most samples: as the innermost frame (self), or anywhere on the stack."""
    out: collections.Counter = collections.Counter()
    for frames, count in stacks.items():
        if not frames:
            continue
        if inclusive:
            for f in {re.sub(r":\d+\)$", ")", fr) for fr in frames}:  # a function once per stack, any line
                out[_short(f)] += count
        else:
            out[_short(re.sub(r":\d+\)$", ")", frames[-1]))] += count
    return out.most_common(n)


# ----------------------------------------------------------------------------- attaching py-spy
@dataclass
class Recording:
    role: str
    pid: int
    path: Path
    proc: subprocess.Popen

    def stop(self) -> collections.Counter:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        return read_collapsed(self.path.read_text()) if self.path.exists() else collections.Counter()


def record(role: str, pid: int, rate: int, out_dir: Path) -> Recording:
    path = out_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', role)}-{pid}.txt"
    argv = [
        str(PY_SPY),
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--nonblocking",
        "--threads",
        "--output",
        str(path),
    ]
    with open(out_dir / f"{path.stem}.py-spy.log", "wb") as err:  # the child keeps its own copy
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    return Recording(role, pid, path, proc)


def profiled_processes(target: str) -> dict[str, int]:
    """Column name -> pid of the target's titled Python processes (see ``cpu_accounting``)."""
    import psutil

    from benchmarks.harness import cpu_accounting
    from benchmarks.harness.targets import APP_OF

    app = APP_OF.get(target, target)
    out: dict[str, int] = {}
    for pid, role in sorted(cpu_accounting.titled_processes().items()):
        if target == "a":
            col = {"vLLM API server": "frontend", "EngineCore of vLLM API server": "engine"}.get(role)
        elif role.startswith(f"EngineCore of replica {app}:"):
            col = "engine"
        elif role.startswith(f"replica {app}:"):
            col = "frontend" if "Server" in role else "ingress"
        elif role == "Serve proxy":
            col = "proxy"
        else:
            col = None
        if col and col not in out:  # e (two replicas): the first replica's processes
            try:
                if "haproxy" in psutil.Process(pid).name():
                    continue  # native code: nothing for py-spy to read
            except psutil.Error:
                continue
            out[col] = pid
    if "engine" in out:  # on CPU the model runs in EngineCore's worker child (vLLM's multiprocessing executor)
        for child in psutil.Process(out["engine"]).children(recursive=True):
            try:
                title = (child.cmdline() or [child.name()])[0]
            except psutil.Error:
                continue
            if title.startswith("VLLM::Worker") or child.name().startswith("VLLM::Worker"):
                out["worker"] = child.pid
                break
    return out


# ----------------------------------------------------------------------------- engine steps
def engine_steps(metrics_text: str, replica_ids: set[str] | None) -> tuple[float, float]:
    """(engine steps, tokens scheduled) so far, from vLLM's ``iteration_tokens`` histogram.

    A plain vLLM server exports ``vllm:iteration_tokens_total_{count,sum}``;
    under Serve Ray exports ``ray_vllm_iteration_tokens_total_{count,sum}``
    with a ``ReplicaId`` label (the replica's unique id, not its app), and
    ``replica_ids`` keeps the profiled target's replicas.
    """
    from load_tests.observe.prom_text import parse_samples

    lines = [ln for ln in metrics_text.splitlines() if "iteration_tokens_total" in ln]
    steps = tokens = 0.0
    for (name, labels), v in parse_samples("\n".join(lines) + "\n").items():
        if replica_ids is not None and dict(labels).get("ReplicaId") not in replica_ids:
            continue
        if name.endswith("iteration_tokens_total_count"):
            steps += v
        elif name.endswith("iteration_tokens_total_sum"):
            tokens += v
    return steps, tokens


def replica_ids(cluster, app: str) -> set[str]:
    """Unique ids of ``app``'s engine replicas."""
    return {
        replica_id(a.get("name") or "") for a in cluster.actors(replica_class_prefix(app, ENGINE_DEPLOYMENT_PREFIX))
    }


def _scrape(urls: list[str]) -> str:
    import httpx

    texts = []
    for url in urls:
        try:
            texts.append(httpx.get(url, timeout=30).text)
        except httpx.HTTPError as e:
            log.warning("scrape %s failed: %s", url, e)
    return "\n".join(texts)


# ----------------------------------------------------------------------------- one target
def profile_target(
    target: str, base_url: str, metrics_urls: list[str], replicas: set[str] | None, ps: list[str], args, spy_dir: Path
) -> dict[str, Any]:
    from benchmarks.harness import cpu_accounting
    from benchmarks.harness.targets import APP_OF, BY_NAME
    from benchmarks.serve_stack import cpu_columns, run_http

    fuzz = BY_NAME[target].fuzz
    asyncio.run(run_http(base_url, ps[: 2 * args.concurrency], args.output_tokens, args.concurrency, fuzz))  # warm-up
    procs = profiled_processes(target)
    log.info("target %s: profiling %s", target, procs)
    # Ray exports a replica's metrics every few seconds: let the warm-up's land first.
    time.sleep(args.metrics_settle_s)
    steps0 = engine_steps(_scrape(metrics_urls), replicas)
    recordings = [record(f"{target}-{col}", pid, args.rate, spy_dir) for col, pid in procs.items()]
    time.sleep(1.0)  # attached
    cpu0 = cpu_accounting.snapshot()
    stats = asyncio.run(run_http(base_url, ps, args.output_tokens, args.concurrency, fuzz))
    cpu = cpu_columns(cpu_accounting.delta(cpu0, cpu_accounting.snapshot()), APP_OF.get(target, target))
    stacks = {col: rec.stop() for col, rec in zip(procs, recordings, strict=False)}
    time.sleep(args.metrics_settle_s)
    scrape = _scrape(metrics_urls)
    (spy_dir / f"metrics-{target}.txt").write_text(scrape)
    steps1 = engine_steps(scrape, replicas)
    n = stats["requests"]
    steps, tokens = steps1[0] - steps0[0], steps1[1] - steps0[1]
    per_proc = {}
    for col, st in stacks.items():
        total = sum(st.values())
        per_proc[col] = {
            "pid": procs[col],
            "samples": total,
            "sampled_ms_per_request": 1000 * total / args.rate / n,
            "categories_ms_per_request": {k: 1000 * v / args.rate / n for k, v in by_category(st).items()},
            "top_self": [(f, 1000 * c / args.rate / n) for f, c in top_functions(st, args.top)],
            "top_inclusive": [(f, 1000 * c / args.rate / n) for f, c in top_functions(st, args.top, inclusive=True)],
        }
    return {
        "target": target,
        **stats,
        "cpu_ms_per_request": {k: 1000 * v / n for k, v in cpu.items()},
        "engine_steps": steps,
        "tokens_per_step": tokens / steps if steps else None,
        "steps_per_request": steps / n,
        "processes": per_proc,
    }


# ----------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--targets", default="a,fb", help="a, and any serve_stack target (b, c0, c1, c, cb, d, e, bd, f0, f, fb)"
    )
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15, help="functions listed per process")
    ap.add_argument(
        "--metrics-settle-s",
        type=float,
        default=12.0,
        help="wait before reading engine steps (Ray exports replica metrics every few seconds)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = ap.parse_args(argv)
    command_logging()
    use_engine_env()
    if not PY_SPY.exists():
        raise SystemExit(f"py-spy not found at {PY_SPY} (it is installed with ray[serve]; run scripts/bootstrap.sh)")
    from benchmarks.harness.targets import APP_OF, PHASES, phase_serve_config
    from benchmarks.serve_stack import _machine, prompts, start_vllm_server
    from fixture_model.build import ensure_model
    from load_tests.operate.local_cluster import LocalCluster
    from serve_app.config.deploy_config import only_applications

    targets = args.targets.split(",")
    phase_of = {t: p for p, ts in PHASES.items() for t in ts}
    unknown = [t for t in targets if t != "a" and t not in phase_of]
    if unknown:
        raise SystemExit(f"unknown targets {unknown}; known: a, {', '.join(phase_of)}")
    model = ensure_model()
    ps = prompts(args.requests, args.prompt_tokens, "plain")
    work_dir = Path(tempfile.mkdtemp(prefix="fuzzserve-profile-"))
    log.info("logs and raw stacks in %s", work_dir)
    meta = {
        "command": "python -m benchmarks.investigations.profile_stack "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "workload": {
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "concurrency": args.concurrency,
            "requests": args.requests,
        },
        "rate_hz": args.rate,
        "raw_stacks": str(work_dir),
    }
    results: list[dict[str, Any]] = []
    if "a" in targets:
        srv, base = start_vllm_server(model, work_dir)
        try:
            results.append(profile_target("a", base, [f"{base}/metrics"], None, ps, args, work_dir))
        finally:
            srv.close()
    for phase in PHASES:
        mine = [t for t in targets if phase_of.get(t) == phase]
        if not mine:
            continue
        cfg, routes, env = phase_serve_config(phase, model)
        cfg = only_applications(cfg, {APP_OF.get(t, t) for t in mine})  # only what is profiled
        with LocalCluster(env=env, log_dir=work_dir / phase, num_cpus=32) as cluster:
            cluster.deploy(cfg, wait_ready=False)
            cluster.wait_http({routes[t] for t in mine})
            for t in mine:
                results.append(
                    profile_target(
                        t,
                        cluster.base_url + routes[t],
                        cluster.metrics_urls,
                        replica_ids(cluster, APP_OF.get(t, t)),
                        ps,
                        args,
                        work_dir,
                    )
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_stack.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    (args.out / "profile_stack.md").write_text(markdown(meta, results))
    plot(results, args.out / "profile_stack.png")
    log.info("wrote %s", args.out / "profile_stack.md")
    return 0


# ----------------------------------------------------------------------------- report
def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    w = meta["workload"]
    lines = [
        "# Where the time goes: py-spy per process",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}.",
        "",
        (
            f"{w['prompt_tokens']} prompt tokens, {w['output_tokens']} output tokens (ignore_eos), streamed, "
            f"concurrency {w['concurrency']}, {w['requests']} requests per target; py-spy at {meta['rate_hz']} Hz, "
            "non-blocking. *Sampled ms* count the samples of threads py-spy did not see as idle; a non-blocking "
            "sampler cannot always tell a thread sleeping in C from one computing, so they say *which code*, "
            "and *CPU ms* (the OS's user+system time of the process role, psutil) say what it cost."
        ),
        "",
        "## Per target",
        "",
        (
            "| target | req/s | TTFT p50 ms | engine steps / request | tokens / step | CPU ms / request: "
            "frontend | engine | ingress | proxy | client | Ray |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r["cpu_ms_per_request"]
        tps = "-" if r["tokens_per_step"] is None else f"{r['tokens_per_step']:.1f}"
        ttft = "-" if r["ttft_p50"] is None else f"{1000 * r['ttft_p50']:.0f}"
        lines.append(
            f"| {r['target']} | {r['req_per_s']:.1f} | {ttft} | {r['steps_per_request']:.2f} | {tps} | "
            + " | ".join(f"{c.get(k, 0):.0f}" for k in ("frontend", "engine", "ingress", "proxy", "client", "Ray"))
            + " |"
        )
    cols = [(r["target"], col) for r in results for col in r["processes"]]
    cats = [name for name, _ in CATEGORIES] + [OTHER]
    lines += [
        "",
        "## Sampled ms per request, by category",
        "",
        "| category | " + " | ".join(f"{t} {col}" for t, col in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    proc = {(r["target"], col): p for r in results for col, p in r["processes"].items()}
    for cat in cats:
        vals = [proc[k]["categories_ms_per_request"].get(cat, 0.0) for k in cols]
        if any(v >= 0.05 for v in vals):
            lines.append(f"| {cat} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    lines.append(
        "| **all sampled** | " + " | ".join(f"**{proc[k]['sampled_ms_per_request']:.1f}**" for k in cols) + " |"
    )
    for t, col in cols:
        p = proc[(t, col)]
        lines += [
            "",
            f"## {t} {col} (pid {p['pid']}): top functions, ms per request",
            "",
            "| self | ms | | inclusive | ms |",
            "|---|---|---|---|---|",
        ]
        for (fs, ms), (fi, mi) in zip(p["top_self"], p["top_inclusive"], strict=False):
            lines.append(f"| `{fs}` | {ms:.2f} | | `{fi}` | {mi:.2f} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(r["target"], col, p) for r in results for col, p in r["processes"].items()]
    if not cols:
        return
    cats = [name for name, _ in CATEGORIES] + [OTHER]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cols)), 6))
    bottom = [0.0] * len(cols)
    cmap = plt.get_cmap("tab20")
    for i, cat in enumerate(cats):
        vals = [p["categories_ms_per_request"].get(cat, 0.0) for _t, _c, p in cols]
        if not any(vals):
            continue
        ax.bar(range(len(cols)), vals, bottom=bottom, label=cat, color=cmap(i % 20))
        bottom = [b + v for b, v in zip(bottom, vals, strict=False)]
    ax.set_xticks(range(len(cols)), [f"{t}\n{c}" for t, c, _p in cols])
    ax.set_ylabel("sampled ms per request")
    ax.set_title("Where each process spends its time (py-spy)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
