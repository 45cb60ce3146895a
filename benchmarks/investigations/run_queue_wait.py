"""Who waits for a CPU while a vLLM server answers one request at a time: the server's threads and the client's.

    python -m benchmarks.investigations.run_queue_wait                      # plain vLLM, client normal then fifo
    python -m benchmarks.investigations.run_queue_wait --arm engine --requests 100 --out out/rqw

Why: plain vLLM's runs on the 2-core host were void as "stalled outside the
engine" (the client's TTFT mean 100+ ms, vLLM's own 11 ms), read at first as
its API server starving. This measures it instead of guessing: for each of
the server's threads (every process under it) and for the client's thread,
the time it ran and the time it waited in a run queue, runnable but not
running (``/proc/<pid>/task/<tid>/schedstat``, nanoseconds), over a window
of sequential streamed completions; beside them the client's TTFT, its time
to the response headers and its end-to-end latency, and the server's own
histograms over the same requests (``vllm:time_to_first_token_seconds``,
``vllm:e2e_request_latency_seconds``, ...). Each client scheduling
(:mod:`benchmarks.harness.client_priority`) is measured on the same server,
one after the other.

The arm is any vLLM-server arm of :mod:`benchmarks.harness.arms` (``plain``,
``engine`` and their variants), started alone on the host. Results:
``run_queue_wait.json`` and ``.md`` in ``--out``. An investigation, not the
headline: one server, one request in flight.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.harness import client_priority
from benchmarks.harness.arms import MODEL_NAME, VllmServer, load_config, make_arm
from benchmarks.harness.prompts import PromptBook
from load_tests.command_logs import command_logging
from load_tests.observe.prom_text import parse_samples, total
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.run_queue_wait")

REPO = Path(__file__).resolve().parents[2]
SERVER_HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
)


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's scheduler counters (``schedstat``: ns on a CPU, ns waiting in a run queue, timeslices)."""

    process: str
    thread: str
    ran_ns: int
    waited_ns: int
    slices: int


def read_schedstat(pid: int, tid: int, proc: Path = Path("/proc")) -> tuple[int, int, int]:
    ran, waited, slices = (int(x) for x in (proc / str(pid) / "task" / str(tid) / "schedstat").read_text().split())
    return ran, waited, slices


def thread_times(pids: list[int], proc: Path = Path("/proc")) -> dict[tuple[int, int], ThreadTimes]:
    """Every thread of ``pids``, by (pid, tid); threads that end while read are left out."""
    out: dict[tuple[int, int], ThreadTimes] = {}
    for pid in pids:
        try:
            process = (proc / str(pid) / "comm").read_text().strip()
            tids = [int(t) for t in os.listdir(proc / str(pid) / "task")]
        except (FileNotFoundError, ProcessLookupError):
            continue
        for tid in tids:
            try:
                name = (proc / str(pid) / "task" / str(tid) / "comm").read_text().strip()
                out[pid, tid] = ThreadTimes(process, name, *read_schedstat(pid, tid, proc))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def per_second(
    before: dict[tuple[int, int], ThreadTimes], after: dict[tuple[int, int], ThreadTimes], seconds: float
) -> list[dict[str, Any]]:
    """Each thread alive at both ends: CPU seconds run and seconds waited per second of the window, busiest first."""
    rows = []
    for key, b in after.items():
        a = before.get(key)
        if a is None:
            continue
        rows.append(
            {
                "pid": key[0],
                "tid": key[1],
                "process": b.process,
                "thread": b.thread,
                "ran": (b.ran_ns - a.ran_ns) / 1e9 / seconds,
                "waited": (b.waited_ns - a.waited_ns) / 1e9 / seconds,
                "slices": b.slices - a.slices,
            }
        )
    return sorted(rows, key=lambda r: r["ran"] + r["waited"], reverse=True)


def histogram_totals(metrics_text: str, names: tuple[str, ...] = SERVER_HISTOGRAMS) -> dict[str, tuple[float, float]]:
    """(sum, count) of each histogram, over every label set (vLLM's one engine), read with the project's one
    exposition parser (:func:`load_tests.observe.prom_text.parse_samples`)."""
    samples = parse_samples(metrics_text)
    return {name: (total(samples, f"{name}_sum"), total(samples, f"{name}_count")) for name in names}


def histogram_means_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict:
    out = {}
    for name, (s1, c1) in after.items():
        s0, c0 = before[name]
        out[name] = {"mean_ms": 1000 * (s1 - s0) / (c1 - c0) if c1 > c0 else None, "count": c1 - c0}
    return out


def stream_one(client: httpx.Client, base_url: str, prompt: str, output_len: int) -> dict[str, float]:
    """One streamed completion: seconds to the response headers, to the first data line, to the end."""
    t0 = time.perf_counter()
    first = None
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": output_len,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    with client.stream("POST", f"{base_url}/v1/completions", json=body) as r:
        r.raise_for_status()
        headers = time.perf_counter() - t0
        for line in r.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the server streamed no data line")
    return {"headers_s": headers, "ttft_s": first, "e2e_s": time.perf_counter() - t0}


def measure(server: VllmServer, prompts: list[str], warmup: list[str], sched: str, output_len: int) -> dict[str, Any]:
    """Sequential requests from a thread of its own under ``sched``; its and the server's threads' times."""
    assert server.server is not None
    root = psutil.Process(server.server.proc.pid)
    pids = [root.pid, *(c.pid for c in root.children(recursive=True))]
    result: dict[str, Any] = {}

    def client_thread() -> None:
        result["client_sched"] = client_priority.apply(sched)
        me = (os.getpid(), threading.get_native_id())
        with httpx.Client(timeout=120) as client:
            for p in warmup:
                stream_one(client, server.base_url, p, output_len)
            h0 = histogram_totals(httpx.get(server.metrics_urls[0]).text)
            t0 = (thread_times(pids), read_schedstat(*me), time.perf_counter())
            result["requests"] = [stream_one(client, server.base_url, p, output_len) for p in prompts]
            t1 = (thread_times(pids), read_schedstat(*me), time.perf_counter())
            h1 = histogram_totals(httpx.get(server.metrics_urls[0]).text)
        seconds = t1[2] - t0[2]
        result["seconds"] = seconds
        result["server_threads"] = per_second(t0[0], t1[0], seconds)
        result["client_thread"] = {
            "ran": (t1[1][0] - t0[1][0]) / 1e9 / seconds,
            "waited": (t1[1][1] - t0[1][1]) / 1e9 / seconds,
            "slices": t1[1][2] - t0[1][2],
        }
        result["server_histograms"] = histogram_means_ms(h0, h1)

    thread = threading.Thread(target=client_thread, name=f"client-{sched}")
    thread.start()
    thread.join()
    if "requests" not in result:
        raise RuntimeError(f"the {sched} client thread failed (see the log)")
    return result


def client_summary(requests: list[dict[str, float]]) -> dict[str, float]:
    """Client figures in ms: TTFT p50 / mean / p90 / max, headers p50 / mean, end-to-end mean."""

    def pct(values: list[float], q: float) -> float:
        s = sorted(values)
        return 1000 * s[min(len(s) - 1, int(q * len(s)))]

    ttft = [r["ttft_s"] for r in requests]
    head = [r["headers_s"] for r in requests]
    return {
        "ttft_p50": pct(ttft, 0.5),
        "ttft_mean": 1000 * sum(ttft) / len(ttft),
        "ttft_p90": pct(ttft, 0.9),
        "ttft_max": 1000 * max(ttft),
        "headers_p50": pct(head, 0.5),
        "headers_mean": 1000 * sum(head) / len(head),
        "e2e_mean": 1000 * sum(r["e2e_s"] for r in requests) / len(requests),
    }


def report(meta: dict[str, Any], phases: list[dict[str, Any]], top: int = 8) -> str:
    lines = [
        f"# Run-queue wait at 1 in flight: {meta['arm']} ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
    lines += [
        (
            "| client | client TTFT p50 / mean / p90 / max ms | headers p50 / mean ms | e2e mean ms "
            "| server TTFT / e2e mean ms | client thread ran / waited (s per s) |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for p in phases:
        c, h, t = p["client"], p["server_histograms"], p["client_thread"]
        server_ttft = h["vllm:time_to_first_token_seconds"]["mean_ms"]
        server_e2e = h["vllm:e2e_request_latency_seconds"]["mean_ms"]
        lines.append(
            f"| {p['client_sched']} | {c['ttft_p50']:.1f} / {c['ttft_mean']:.1f} / {c['ttft_p90']:.1f} / "
            f"{c['ttft_max']:.1f} | {c['headers_p50']:.1f} / {c['headers_mean']:.1f} | {c['e2e_mean']:.1f} "
            f"| {server_ttft or float('nan'):.1f} / {server_e2e or float('nan'):.1f} "
            f"| {t['ran']:.3f} / {t['waited']:.3f} |"
        )
    for p in phases:
        lines += ["", f"Server threads, client {p['client_sched']} (s per s of the window, busiest {top}):", ""]
        lines += ["| process | thread | ran | waited | slices |", "|---|---|---|---|---|"]
        for r in p["server_threads"][:top]:
            lines.append(f"| {r['process']} | {r['thread']} | {r['ran']:.3f} | {r['waited']:.3f} | {r['slices']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.run_queue_wait",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--arm", default="plain", help="a vLLM-server arm of benchmarks.harness.arms (plain, engine, ...)")
    ap.add_argument("--requests", type=int, default=60, help="measured requests per client scheduling")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured requests first, per client scheduling")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument(
        "--client-sched",
        default="normal,fifo",
        help=f"comma-separated, in order, of {', '.join(client_priority.POLICIES)}",
    )
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml")
    ap.add_argument("--out", type=Path, default=Path("out/run_queue_wait"))
    args = ap.parse_args(argv)
    scheds = args.client_sched.split(",")
    for s in scheds:
        if s not in client_priority.POLICIES:
            ap.error(f"--client-sched: unknown {s!r}")
    command_logging()
    use_engine_env()
    from fixture_model.build import ensure_model

    model = ensure_model()
    book = PromptBook(seed=7)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-rqw-"))
    arm = make_arm(args.arm, load_config(args.config), model, work)
    if not isinstance(arm, VllmServer):
        ap.error(f"--arm {args.arm}: only vLLM-server arms (plain, engine and their variants)")
    meta = {
        "command": "python -m benchmarks.investigations.run_queue_wait "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "arm": args.arm,
    }
    phases = []
    with arm:
        for i, sched in enumerate(scheds):
            prompts = list(book.unique(f"run-{i}", args.requests, args.input_len).prompts)
            warm = list(book.unique(f"warm-{i}", args.warmup, args.input_len).prompts)
            res = measure(arm, prompts, warm, sched, args.output_len)
            res["client"] = client_summary(res.pop("requests"))
            phases.append(res)
            log.info("client %s: %s; client thread %s", res["client_sched"], res["client"], res["client_thread"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run_queue_wait.json").write_text(json.dumps({"meta": meta, "phases": phases}, indent=1))
    (args.out / "run_queue_wait.md").write_text(report(meta, phases))
    log.info("results in %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
