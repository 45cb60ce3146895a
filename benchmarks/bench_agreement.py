"""Do the stress CLI's figures agree with vLLM's own ``bench serve`` on the same target and workload?

    python -m benchmarks.bench_agreement --url http://127.0.0.1:8000 [--concurrency 32 --requests 640]
    python -m benchmarks.bench_agreement --shipped     # serve_config.yaml in a fresh local cluster, as deployed
    python -m benchmarks.bench_agreement --echo        # against testkit/echo_server.py (what the test runs)

Both clients drive the same deployment, one after the other, with the same
workload: vLLM's random dataset shape (``--input-len`` prompt tokens,
exactly ``--output-len`` output tokens with ``ignore_eos``, streamed
completions, no fuzz) at ``--concurrency`` in flight, ``--requests``
requests each. Ours is the stress-test CLI itself (``python -m load_tests
--scenario bench``, its summary.json); theirs is ``vllm bench serve``
(:mod:`benchmarks.vllm_bench_serve`, its ``--save-result`` JSON). Compared:
request throughput, TTFT p50 and TPOT p50, each within ``--tolerance``
(15 %): the ratio ours / vLLM's of each pair of neighbouring runs, and with
``--pairs N`` (the clients take turns: vllm, ours, ours, vllm, ...) the
median of those ratios, as ``benchmarks.vs_vllm`` compares (the host's speed
drifts by +-25 % within minutes, more than the tolerance). The API key, if the target needs one, comes from
``FUZZSERVE_API_KEYS`` (vLLM's client reads it as ``OPENAI_API_KEY``).

``--echo`` starts ``testkit/echo_server.py`` with deterministic latencies
(``--ttft-ms``, ``--itl-ms``) and answers whose every token's text is
empty, so that a client counting text instead of tokens would have no
TTFT at all and disagree: ``tests/test_bench_agreement.py`` runs it in the
fast suite. The tokenizer vLLM's client needs to make random prompts is
the fixture's (``fixture_model.build.build_tokenizer``, no training).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from serve_app.command_logs import command_logging

log = logging.getLogger("fuzzserve.benchmarks.bench_agreement")
REPO = Path(__file__).resolve().parent.parent
FIGURES = ("requests_per_s", "ttft_p50_s", "tpot_p50_s")
TOLERANCE = 0.15


def save_tokenizer(out: Path) -> Path:
    """The fixture tokenizer (built from code, nothing trained) in ``out``, for vLLM's random prompts."""
    from fixture_model.build import build_tokenizer

    build_tokenizer().save_pretrained(out)
    return out


def theirs(url: str, tokenizer: Path, concurrency: int, requests: int, input_len: int, output_len: int,
           work: Path, api_key: str | None) -> dict[str, Any]:
    """``vllm bench serve``'s figures (its own JSON, seconds)."""
    argv = [sys.executable, "-m", "benchmarks.vllm_bench_serve", "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", "fixture", "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--ignore-eos", "--max-concurrency", str(concurrency), "--num-prompts", str(requests),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99", "--save-result",
            "--result-dir", str(work), "--result-filename", "vllm_bench.json", "--disable-tqdm"]
    env = dict(os.environ) | ({"OPENAI_API_KEY": api_key} if api_key else {})
    before = _children_cpu_s()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env, cwd=REPO)
    cpu = _children_cpu_s() - before
    if proc.returncode:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    res = json.loads((work / "vllm_bench.json").read_text())
    return {"tool": "vllm bench serve", "requests": res["completed"], "failed": res.get("failed", 0),
            "requests_per_s": res["request_throughput"], "ttft_p50_s": res["median_ttft_ms"] / 1000,
            "tpot_p50_s": res["median_tpot_ms"] / 1000, "ttft_p99_s": res["p99_ttft_ms"] / 1000,
            "client_cpu_s": cpu}


def ours(url: str, concurrency: int, requests: int, input_len: int, output_len: int, work: Path,
         api_key: str | None, metrics_urls: list[str], quick_settle: bool = False,
         scrape_interval_s: float | None = None) -> dict[str, Any]:
    """The stress-test CLI's figures (``python -m load_tests --scenario bench``, its summary.json)."""
    mix = {"prompt_tokens": input_len, "max_tokens": [output_len, output_len]}
    argv = [sys.executable, "-m", "load_tests", "--scenario", "bench", "--url", url, "--concurrency",
            str(concurrency), "--requests", str(requests), "--mix", json.dumps(mix), "--no-sweep", "--no-progress",
            "--out", str(work / "ours"), *(a for m in metrics_urls for a in ("--metrics-url", m))]
    if api_key:
        argv += ["--api-key", api_key]
    if scrape_interval_s is not None:
        argv += ["--scrape-interval", str(scrape_interval_s)]
    if quick_settle:  # the echo server's counters are exact at once: no metrics export interval to wait out
        argv += ["--scrape-interval", "0.3", "--settle-interval", "0.3", "--settle-timeout", "3"]
    before = _children_cpu_s()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=REPO)
    cpu = _children_cpu_s() - before
    summary_path = work / "ours" / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"load_tests wrote no summary ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    s = json.loads(summary_path.read_text())
    lat, tp = s["latency_s"], s["throughput"]
    return {"tool": "python -m load_tests", "requests": tp["completed"], "passed": s["passed"],
            "failures": s["failures"], "requests_per_s": tp["requests_per_s"], "ttft_p50_s": lat["ttft"]["p50"],
            "tpot_p50_s": lat["tpot"]["p50"], "ttft_p99_s": lat["ttft"]["p99"],
            "ttft_requests": lat["ttft"]["requests"], "client_cpu_s": cpu}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children: a client's whole run, start-up included."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def ratios(mine: dict[str, Any], vllm: dict[str, Any]) -> dict[str, float | None]:
    """Ours over vLLM's, per compared figure (None where either is missing)."""
    return {k: mine[k] / vllm[k] if mine.get(k) is not None and vllm.get(k) else None
            for k in (*FIGURES, "ttft_p99_s", "client_cpu_s")}


def median_pair_ratios(ours_runs: list[dict[str, Any]], vllm_runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Per figure, the median over the pairs of ours / vLLM's in the same pair: the host's speed drifts by
    +-25 % between runs, and a pair's two runs are neighbours (as benchmarks.vs_vllm compares)."""
    per_pair = [ratios(a, b) for a, b in zip(ours_runs, vllm_runs)]
    return {k: None if any(r[k] is None for r in per_pair) else statistics.median(r[k] for r in per_pair)
            for k in per_pair[0]}


def disagreements(ratio: dict[str, float | None], tolerance: float = TOLERANCE) -> list[str]:
    """Each compared figure whose ratio (ours / vLLM's) is further than ``tolerance`` from 1, or missing."""
    out = []
    for k in FIGURES:
        r = ratio.get(k)
        if r is None:
            out.append(f"{k}: not measured by both clients: not comparable")
        elif abs(r - 1) > tolerance:
            out.append(f"{k}: ours / vLLM's = {r:.3f} ({r - 1:+.0%}, beyond {tolerance:.0%})")
    return out


def table(result: dict[str, Any]) -> str:
    mine, vllm, pairs = result["ours"], result["vllm"], result["runs"]
    lines = ["| figure | python -m load_tests (median) | vllm bench serve (median) | ours / theirs: median of "
             "the pairs | each pair |", "|---|---|---|---|---|"]
    per_pair = [ratios(a, b) for a, b in zip(pairs["ours"], pairs["vllm"])]
    for k, r in result["ratios"].items():
        a, b = mine.get(k), vllm.get(k)
        unit = (lambda v: f"{v:.2f}") if k.endswith(("per_s", "cpu_s")) else (lambda v: f"{v * 1000:.1f} ms")
        each = ", ".join("-" if p[k] is None else f"{p[k]:.2f}" for p in per_pair)
        lines.append(f"| {k} | {'-' if a is None else unit(a)} | {'-' if b is None else unit(b)} | "
                     f"{'-' if r is None else f'{r:.3f}'} | {each} |")
    lines.append(f"| requests measured (runs) | {mine.get('requests')} ({mine.get('runs', 1)}) | "
                 f"{vllm.get('requests')} ({vllm.get('runs', 1)}) | | |")
    return "\n".join(lines)


def start_echo(ttft_ms: float, itl_ms: float) -> tuple[subprocess.Popen, str]:
    """``testkit/echo_server.py`` on a free port, every token's text empty; (process, base URL)."""
    proc = subprocess.Popen([sys.executable, "-m", "testkit.echo_server", "--port", "0", "--ttft-ms", str(ttft_ms),
                             "--itl-ms", str(itl_ms), "--empty-text"], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"the echo server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.rsplit(':', 1)[-1])}"


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over runs of one client (``requests``: the sum)."""
    out = {k: statistics.median(r[k] for r in runs) for k in (*FIGURES, "ttft_p99_s", "client_cpu_s")
           if all(r.get(k) for r in runs)}
    return out | {"requests": sum(r["requests"] for r in runs), "runs": len(runs)}


def compare_on(url: str, args: argparse.Namespace, metrics_urls: list[str], work: Path, tokenizer: Path,
               api_key: str | None, quick_settle: bool = False) -> dict[str, Any]:
    """``args.pairs`` pairs of runs, the order flipped every pair (vllm, ours, ours, vllm, ...); the medians."""
    shape = (args.concurrency, args.requests, args.input_len, args.output_len)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "vllm": []}
    first = args.order.split(",")
    for pair in range(args.pairs):
        for who in (first if pair % 2 == 0 else first[::-1]):
            if who == "ours" and not quick_settle:  # after the warm-up or vLLM's run
                # Ray exports a replica's counters every few seconds: the CLI's baseline scrape must see the other
                # client's requests, or its client/server cross-check counts them as its own
                log.info("letting the counters settle for %.0f s", args.settle_s)
                time.sleep(args.settle_s)
            t0 = time.monotonic()
            if who == "vllm":
                run = theirs(url, tokenizer, *shape, work, api_key)
            else:
                run = ours(url, *shape, work, api_key, metrics_urls, quick_settle, args.scrape_interval)
            run["pair"] = pair
            runs[who].append(run)
            log.info("%s: %s (%.0f s)", who, run, time.monotonic() - t0)
    ratio = median_pair_ratios(runs["ours"], runs["vllm"])
    return {"ours": median_figures(runs["ours"]), "vllm": median_figures(runs["vllm"]), "runs": runs,
            "ratios": ratio, "disagreements": disagreements(ratio, args.tolerance),
            "verdicts": [r.get("failures") for r in runs["ours"]]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_agreement", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running deployment's base URL")
    where.add_argument("--echo", action="store_true", help="start testkit/echo_server.py and compare on it")
    where.add_argument("--shipped", action="store_true",
                       help="deploy serve_config.yaml (ray start + serve deploy, a fresh single-node cluster, torn "
                            "down after) and compare on it")
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml", help="--shipped: the Serve config")
    ap.add_argument("--warmup", type=int, default=None,
                    help="requests sent with vLLM's client before either measured run (default: 0 on the echo "
                         "server, 200 otherwise: the engines' first batches compile)")
    ap.add_argument("--metrics-url", action="append", default=[],
                    help="the deployment's metrics endpoints (default: Ray's service discovery file)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=640)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="--echo: the server's time to first token")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="--echo: its time between tokens")
    ap.add_argument("--order", default="vllm,ours", help="which client runs first (flipped every other pair)")
    ap.add_argument("--pairs", type=int, default=1, help="pairs of runs; the figures compared are the medians")
    ap.add_argument("--settle-s", type=float, default=25.0,
                    help="seconds between the two runs on a real deployment (Ray exports counters every 10 s)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    ap.add_argument("--scrape-interval", type=float, default=None,
                    help="our CLI's --scrape-interval (default: the CLI's own, 2 s)")
    ap.add_argument("--out", type=Path, default=None, help="write agreement.json and agreement.md here")
    args = ap.parse_args(argv)
    command_logging()
    echo = shipped = None
    warmup = args.warmup if args.warmup is not None else (0 if args.echo else 200)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            if args.echo:
                echo, url = start_echo(args.ttft_ms, args.itl_ms)
                metrics = [f"{url}/metrics"]
            elif args.shipped:
                from benchmarks.vs_vllm import Shipped

                shipped = Shipped(args.config, Path(tmp) / "cluster").__enter__()
                url, metrics = shipped.base_url, shipped.cluster.metrics_urls
            else:
                url, metrics = args.url.rstrip("/"), args.metrics_url
            api_key = os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None
            tokenizer = save_tokenizer(Path(tmp) / "tokenizer")
            if warmup:
                log.info("warming up with %d requests (vLLM's client, not measured)", warmup)
                (Path(tmp) / "warmup").mkdir()
                theirs(url, tokenizer, args.concurrency, warmup, args.input_len, args.output_len, Path(tmp) / "warmup",
                       api_key)
            result = compare_on(url, args, metrics, Path(tmp), tokenizer, api_key, quick_settle=args.echo)
        finally:
            if echo is not None:
                echo.terminate()
                echo.wait(10)
            if shipped is not None:
                shipped.__exit__(None, None, None)
    result["workload"] = {k: getattr(args, k) for k in ("concurrency", "requests", "input_len", "output_len")}
    result["target"] = "echo server" if args.echo else (f"{args.config} (shipped)" if args.shipped else args.url)
    result["warmup_requests"] = warmup
    result["scrape_interval_s"] = args.scrape_interval
    md = table(result)
    sys.stdout.write(md + "\n" + ("agree within %.0f%%\n" % (100 * args.tolerance) if not result["disagreements"]
                                  else "DISAGREE: " + "; ".join(result["disagreements"]) + "\n"))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agreement.json").write_text(json.dumps(result, indent=2))
        (args.out / "agreement.md").write_text(md + "\n")
    return 1 if result["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
