"""Do the stress CLI's figures agree with vLLM's own ``bench serve`` on the same target and workload?

    python -m benchmarks.bench_agreement --url http://127.0.0.1:8000 [--concurrency 32 --requests 640]
    python -m benchmarks.bench_agreement --shipped     # serve_config.yaml in a fresh local cluster, as deployed
    python -m benchmarks.bench_agreement --echo --pairs 2 --smoke   # against testkit/echo_server.py (the test)

Both clients drive the same deployment, taking turns (vllm, ours, ours,
vllm, ...: ``--pairs`` pairs, an even number, at least 6), with the same
workload and **the same request bodies**: streamed greedy completions of
``--input-len`` tokens (BOS included) of random vocabulary words, exactly
``--output-len`` output tokens (``ignore_eos``), the body vLLM's client sends
(``repetition_penalty`` 1.0, ``logprobs`` null, ``temperature`` 0) at
``--concurrency`` in flight, ``--requests`` each, each run preceded by the
same idle gap (``--settle-s``). Only the prompts' words differ between runs:
every run sends prompts no other run (nor the warm-up) sent
(:mod:`benchmarks.harness.prompts`), so that neither client's run is served from a
cache the other filled; vLLM's client reads them through its ``custom``
dataset in file order, ours through ``--prompts-file``. Where the target has
prefix-cache counters, each run's hits are read from them
(:mod:`benchmarks.harness.server_counters`) and a run with any is void.

Ours is the stress-test CLI's load run: :func:`load_tests.runner.run.run`
called in this process with the inputs ``python -m load_tests --scenario
bench --prompts-file ...`` runs with (:func:`load_tests.cli.inputs_for`: the
CLI's own parser and defaults), its typed
:class:`~load_tests.results.models.RunSummary` read directly; theirs is
``vllm bench serve``, also called in this process
(:mod:`benchmarks.harness.vllm_bench_serve`: vLLM's parser and
``vllm.benchmarks.serve.main``, its result dict). Compared:
request throughput, TTFT p50 and TPOT p50, each as the median over the pairs
of ours / vLLM's with its bootstrap 90 % interval (:mod:`benchmarks.harness.pair_stats`,
the protocol of ``benchmarks.vs_vllm``). The verdict is fixed before the
data: a figure **agrees** only if its whole interval lies within
1 +- ``--tolerance`` (15 %), **disagrees** if it lies wholly outside, and is
**inconclusive** otherwise; the clients agree only if every figure does.

**Against the server** (issue 47), which decides the exit code: during
every run the server's finished-requests counter is read every
``--rate-interval`` seconds (:mod:`benchmarks.harness.server_rate`), and each
client's requests/s is set against the server's own steady rate over that
run (its middle, edges left out); our CLI **agrees** when the median of ours
/ server over its runs, with its whole 90 % interval, lies within 5 %
(exit 0; 1 otherwise). vLLM's client gets the same line, and each tool's
denominator is named in the report: a run must be long enough (30 s or
more under Ray, whose agent exports counters every few seconds) for the
server's rate to exist. The API key, if the target needs one, comes from
``FUZZSERVE_API_KEYS`` (vLLM's client reads it as ``OPENAI_API_KEY``).

Each client's CPU (``client_cpu_s``, shown, not judged) is counted the same
way: this process's CPU seconds (``getrusage(RUSAGE_SELF)``, user + system,
every thread) over the call that runs the load, start-up excluded for both
(importing vLLM costs some 10 s of CPU, our packages some 2 s:
:func:`benchmarks.harness.inprocess_clients.start_clients` imports what either would import on its first run
before any measured run). Both clients share this process,
so for the call the heap that exists before it (both tools' modules, the
harness) is frozen (``gc.freeze``, which vLLM's bench does itself before it
sends): neither client's garbage collector walks the other's objects.
What a call does of its own is counted: vLLM's client loads its tokenizer
and samples its dataset; ours scrapes the counters before and after, waits
for quiescence and writes its report. (Counted as child processes, start-up
included, as this benchmark once did, vLLM's figure was mostly its import.)

``--guidellm`` adds a third client to every pair, GuideLLM in an environment of its own
(:mod:`benchmarks.harness.guidellm_client`, built on first use; the project's install never installs it), judged against
the server the same way, and its figures set against ours in a table of their own.

``--echo`` starts ``testkit/echo_server.py`` with deterministic latencies
(``--ttft-ms``, ``--itl-ms``) and answers whose every token's text is
empty, so that a client counting text instead of tokens would have no
TTFT at all and disagree: ``tests/test_bench_agreement.py`` runs it in the
fast suite, and reads back the bodies the echo server received.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness import guidellm_client, pair_stats
from benchmarks.harness.inprocess_clients import ours, save_tokenizer, start_clients, theirs
from benchmarks.harness.prompts import PromptBook, PromptSet, check_disjoint
from benchmarks.harness.server_counters import READ_ERRORS, CacheCounters, read_counters, wait_for_requests
from benchmarks.harness.server_rate import RateSampler, steady_rate
from load_tests.command_logs import command_logging
from load_tests.judge.server_latency import server_latency
from load_tests.observe.counters import ReplicaCounters
from load_tests.observe.scraper import ScrapeFailed, scrape
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.bench_agreement")
REPO = Path(__file__).resolve().parent.parent
FIGURES = ("requests_per_s", "ttft_p50_s", "tpot_p50_s")
TOLERANCE = 0.15
# Each client's requests/s against the server's own steady rate over its run (benchmarks.harness.server_rate):
# agrees only if the whole interval of client / server lies within 1 +- this (issue 47: the CLI within 5 % of the
# server).
SERVER_TOLERANCE = 0.05
# What each tool divides its requests/s by (both: every request it completed).
DIVIDES_BY = {
    "ours": "complete answers / the load's window: the first request sent to the last answer (RunSummary.wall_s)",
    "vllm": "completed requests / its benchmark duration: the first request sent to the last response",
    "guidellm": guidellm_client.DIVIDES_BY,
}
NAMES = {"ours": "ours", "vllm": "vLLM's", "guidellm": "GuideLLM's"}


def ratios(mine: dict[str, Any], vllm: dict[str, Any]) -> dict[str, float | None]:
    """Ours over vLLM's, per compared figure (None where either is missing)."""
    return {
        k: mine[k] / vllm[k] if mine.get(k) is not None and vllm.get(k) else None
        for k in (*FIGURES, "ttft_p99_s", "client_cpu_s")
    }


def compare_figures(
    ours_runs: list[dict[str, Any]], vllm_runs: list[dict[str, Any]], tolerance: float = TOLERANCE
) -> dict[str, dict[str, Any]]:
    """Per figure: the median over the pairs of ours / vLLM's in the same pair, its bootstrap 90 % interval and
    the verdict (:func:`benchmarks.harness.pair_stats.agreement`). A figure either client did not measure in some pair
    is "not comparable". Void runs' pairs count nowhere."""
    pairs = [(a, b) for a, b in zip(ours_runs, vllm_runs, strict=False) if not a.get("void") and not b.get("void")]
    out: dict[str, dict[str, Any]] = {}
    for k in (*FIGURES, "ttft_p99_s", "client_cpu_s"):
        values = [(b.get(k), a.get(k)) for a, b in pairs]
        compared = [(v, w) for v, w in values if v and w is not None]
        if not pairs or len(compared) < len(values):
            out[k] = {"verdict": "not comparable", "pairs": len(pairs)}
            continue
        ratio = pair_stats.median_ratio(compared)
        out[k] = {**ratio, "verdict": pair_stats.agreement(ratio["ci90"], tolerance)}
    return out


def verdict(figures: dict[str, dict[str, Any]]) -> str:
    """``agrees`` if every compared figure agrees; ``disagrees`` if any disagrees (or cannot be compared);
    otherwise ``inconclusive``."""
    got = [figures[k]["verdict"] for k in FIGURES]
    if all(v == "agrees" for v in got):
        return "agrees"
    if any(v in ("disagrees", "not comparable") for v in got):
        return "disagrees"
    return "inconclusive"


def figure_rows(
    figures: dict[str, dict[str, Any]],
    mine: dict[str, Any],
    theirs_: dict[str, Any],
    ours_runs: list[dict[str, Any]],
    their_runs: list[dict[str, Any]],
    name: str,
) -> list[str]:
    """The table of our figures against one outside client's: medians, the ratio's interval, verdict, each pair."""
    lines = [
        (
            f"| figure | python -m load_tests (median) | {name} (median) | ours / theirs: median of "
            "the pairs [90 % interval] | verdict | each pair |"
        ),
        "|---|---|---|---|---|---|",
    ]
    per_pair = [ratios(a, b) for a, b in zip(ours_runs, their_runs, strict=False)]
    for k, f in figures.items():
        a, b = mine.get(k), theirs_.get(k)
        unit = (lambda v: f"{v:.2f}") if k.endswith(("per_s", "cpu_s")) else (lambda v: f"{v * 1000:.1f} ms")
        each = ", ".join("-" if p[k] is None else f"{p[k]:.2f}" for p in per_pair)
        med = "-" if "median" not in f else f"{f['median']:.3f} [{f['ci90'][0]:.3f}, {f['ci90'][1]:.3f}]"
        shown = f["verdict"] if k in FIGURES else "(not judged)"
        lines.append(
            f"| {k} | {'-' if a is None else unit(a)} | {'-' if b is None else unit(b)} | {med} | {shown} | {each} |"
        )
    lines.append(
        f"| requests measured (runs) | {mine.get('requests')} ({mine.get('runs', 1)}) | "
        f"{theirs_.get('requests')} ({theirs_.get('runs', 1)}) | | | |"
    )
    return lines


def table(result: dict[str, Any]) -> str:
    mine, pairs = result["ours"], result["runs"]
    lines = (
        figure_rows(result["figures"], mine, result["vllm"], pairs["ours"], pairs["vllm"], "vllm bench serve")
        if "vllm" in pairs
        else []
    )
    hits = [f"{who} pair {r['pair']}: {r['void']}" for who in pairs for r in pairs[who] if r.get("void")]
    if "figures_guidellm" in result:
        lines += [
            "",
            (
                "Ours against GuideLLM (its own environment, benchmarks/harness/guidellm_client.py; its CPU is its "
                "process tree's, start-up included):"
            ),
            "",
            *figure_rows(
                result["figures_guidellm"], mine, result["guidellm"], pairs["ours"], pairs["guidellm"], "GuideLLM"
            ),
        ]
    lines += [
        "",
        (
            "Against the server's own rate (its finished-requests counter over the middle of each run, "
            "benchmarks/harness/server_rate.py): client / server, median over the client's runs [90 % interval]:"
        ),
        "",
        "| client | divides by | server req/s (median) | client / server | verdict | each run |",
        "|---|---|---|---|---|---|",
    ]
    for who in pairs:
        a = result.get("against_server", {}).get(who, {})
        each = ", ".join(
            "-" if not r.get("server") else f"{r['requests_per_s'] / r['server']['requests_per_s']:.3f}"
            for r in pairs[who]
        )
        med = "-" if "median" not in a else f"{a['median']:.3f} [{a['ci90'][0]:.3f}, {a['ci90'][1]:.3f}]"
        srv = "-" if "server_requests_per_s" not in a else f"{a['server_requests_per_s']:.2f}"
        lines.append(f"| {who} | {DIVIDES_BY[who]} | {srv} | {med} | {a.get('verdict', '-')} | {each} |")
    lines += [
        "",
        (
            "The server's own latency beside each client's (vLLM's histograms in the replicas' frontends over "
            "the client's run, p50 interpolated in its bucket; load_tests/judge/server_latency.py), median over "
            "the client's runs:"
        ),
        "",
        "| client | TTFT p50 client | TTFT p50 server | TPOT p50 client | TPOT p50 server | ITL p50 server |",
        "|---|---|---|---|---|---|",
    ]
    for who in pairs:
        lines.append(
            f"| {who} | "
            + " | ".join(
                _median_ms(pairs[who], k)
                for k in (
                    ("ttft_p50_s",),
                    ("server_latency", "ttft_p50_s"),
                    ("tpot_p50_s",),
                    ("server_latency", "tpot_p50_s"),
                    ("server_latency", "itl_p50_s"),
                )
            )
            + " |"
        )
    lines.append("")
    lines.append("Void runs (cache hits on a workload that must be cold): " + ("; ".join(hits) if hits else "none"))
    return "\n".join(lines)


def start_echo(ttft_ms: float, itl_ms: float, record_bodies: Path | None = None) -> tuple[subprocess.Popen, str]:
    """``testkit/echo_server.py`` on a free port, every token's text empty; (process, base URL)."""
    argv = [
        sys.executable,
        "-m",
        "testkit.echo_server",
        "--port",
        "0",
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
        "--empty-text",
    ]
    if record_bodies is not None:
        argv += ["--record-bodies", str(record_bodies)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    assert proc.stdout is not None  # stdout=PIPE
    line = proc.stdout.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"the echo server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.rsplit(':', 1)[-1])}"


def _median_ms(runs: list[dict[str, Any]], path: tuple[str, ...]) -> str:
    """The median over ``runs`` of the figure at ``path`` (seconds) in ms, over the runs that have it."""
    values = []
    for r in runs:
        v: Any = r
        for key in path:
            v = v.get(key) if isinstance(v, dict) else None
        if v is not None and not r.get("void"):
            values.append(float(v))
    return f"{statistics.median(values) * 1000:.1f} ms ({len(values)} runs)" if values else "-"


def median_figures(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over runs of one client (``requests``: the sum)."""
    out = {
        k: statistics.median(r[k] for r in runs)
        for k in (*FIGURES, "ttft_p99_s", "client_cpu_s")
        if all(r.get(k) for r in runs)
    }
    return out | {"requests": sum(r["requests"] for r in runs), "runs": len(runs)}


def run_size(requests: int, rate: float, min_run_s: float) -> int:
    """Requests per run: at least ``requests``, and enough for ``min_run_s`` seconds at ``rate`` (the warm-up's),
    so that ramp-up and tail are a small share of each run and the server's rate has exports to be read from."""
    return max(requests, math.ceil(rate * min_run_s)) if rate > 0 else requests


def prompt_sets(
    pairs: int, requests: int, input_len: int, warmup: int, seed: int, clients: tuple[str, ...] = ("vllm", "ours")
) -> dict[tuple[str, int], PromptSet]:
    """(client, pair) -> the prompts of that run, ("warmup", 0) -> the warm-up's; all from one book, none shared."""
    book = PromptBook(seed)
    sets = {("warmup", 0): book.unique("warmup", warmup, input_len)}
    for pair in range(pairs):
        for who in clients:
            sets[who, pair] = book.unique(f"{who}-{pair}", requests, input_len)
    problems = check_disjoint(sets.values())
    if problems:
        raise RuntimeError("prompt sets overlap: " + "; ".join(problems))
    return sets


def cache_counters(metrics_urls: list[str]) -> CacheCounters | None:
    """The target's cache counters now, or None where its endpoints do not answer (counted as unknown)."""
    try:
        return read_counters(metrics_urls)
    except READ_ERRORS as e:
        log.warning("cache counters unreadable (%s): this run's cache hits are not checked", e)
        return None


def replica_histograms(metrics_urls: list[str]) -> dict[str, ReplicaCounters] | None:
    """Every replica's counters and latency histograms now, or None where an endpoint does not answer."""
    try:
        return scrape(metrics_urls)
    except ScrapeFailed as e:
        log.warning("latency histograms unreadable (%s): this run has no server-side latency", e)
        return None


def server_side(
    before: dict[str, ReplicaCounters] | None,
    after: dict[str, ReplicaCounters] | None,
) -> dict[str, Any] | None:
    """The server's own TTFT / ITL / TPOT p50 over a run (vLLM's histograms, ``load_tests.judge.server_latency``),
    each with the bucket it lies in."""
    if before is None or after is None:
        return None
    lat = server_latency(after, before)
    out: dict[str, Any] = {}
    for name in ("ttft", "itl", "tpot"):
        row = getattr(lat, name)
        out[f"{name}_p50_s"] = row.p50
        out[f"{name}_p50_bucket_s"] = row.bucket_s.get("p50")
        out[f"{name}_count"] = row.count
    return out


def _call_client(
    who: str,
    url: str,
    args: argparse.Namespace,
    prompts: PromptSet,
    dataset: Path,
    work: Path,
    tokenizer: Path,
    api_key: str | None,
    metrics_urls: list[str],
    quick_settle: bool,
) -> dict[str, Any]:
    """One client's measured run of ``prompts`` (``dataset``: them as vLLM's ``custom`` dataset); its figures."""
    if who == "vllm":
        return theirs(url, tokenizer, args.concurrency, dataset, args.requests, args.output_len, work, api_key)
    if who == "guidellm":
        return guidellm_client.run(
            url,
            guidellm_client.write_dataset(
                prompts.prompts, args.output_len, work / "prompts" / f"{prompts.name}-guidellm.jsonl"
            ),
            tokenizer,
            args.concurrency,
            args.requests,
            work,
            api_key,
        )
    return ours(
        url,
        args.concurrency,
        dataset,
        args.requests,
        args.output_len,
        work,
        api_key,
        metrics_urls,
        quick_settle,
        args.scrape_interval,
    )


def _server_counts(
    run: dict[str, Any],
    metrics_urls: list[str],
    before: CacheCounters,
    before_lat: dict[str, ReplicaCounters] | None,
) -> None:
    """The server's counters over ``run`` (from ``before``) into it: its cache hits (any: the run is void) and its
    own latency; nothing where the counters never counted the run's requests."""
    try:
        after = wait_for_requests(metrics_urls, before, int(run["requests"]))
        delta = after - before
        run["counters"] = delta.to_json()
        run["server_latency"] = server_side(before_lat, replica_histograms(metrics_urls))
        if delta.hit_tokens > 0:
            run["void"] = (
                f"{delta.prefix_cache_hits:.0f} prompt tokens from the prefix cache, "
                f"{delta.external_hits:.0f} from the offload tier"
            )
    except TimeoutError as e:
        log.warning("%s", e)


def measure_run(
    who: str,
    pair: int,
    url: str,
    args: argparse.Namespace,
    metrics_urls: list[str],
    work: Path,
    tokenizer: Path,
    api_key: str | None,
    prompts: PromptSet,
    quick_settle: bool,
) -> dict[str, Any]:
    """One client's run in ``pair``: after the idle gap, its load with the server's rate read throughout, then the
    server's counters over it; the run's figures, the server's rate and the sampler's own CPU apart."""
    if not quick_settle:
        # the same idle gap before every run: Ray exports a replica's counters every few seconds, and the
        # CLI's baseline scrape must see the previous run's requests (its cross-check would count them)
        log.info("idle gap of %.0f s before the run", args.settle_s)
        time.sleep(args.settle_s)
    dataset = prompts.write_jsonl(work / "prompts" / f"{prompts.name}.jsonl")
    before = cache_counters(metrics_urls)
    before_lat = replica_histograms(metrics_urls) if before is not None else None
    t0 = time.monotonic()
    with RateSampler(metrics_urls, interval_s=args.rate_interval) as sampler:
        run = _call_client(who, url, args, prompts, dataset, work, tokenizer, api_key, metrics_urls, quick_settle)
        in_call_cpu_s = sampler.cpu_s  # the sampler's CPU while the client's call ran (its tail comes after)
        if not quick_settle:  # the last export of the run's counts comes up to one export period later
            time.sleep(args.rate_tail_s)
    run["pair"], run["prompts"] = pair, prompts.describe()
    run["server"] = steady_rate(sampler.samples)
    run["server_samples"] = len(sampler.samples)
    run["client_cpu_s"] -= in_call_cpu_s  # the sampler's reads ran in this process: not the client's
    run["sampler_cpu_s"] = in_call_cpu_s
    if before is not None:
        _server_counts(run, metrics_urls, before, before_lat)
    log.info("%s: %s (%.0f s)", who, run, time.monotonic() - t0)
    return run


def compare_on(
    url: str,
    args: argparse.Namespace,
    metrics_urls: list[str],
    work: Path,
    tokenizer: Path,
    api_key: str | None,
    sets: dict[tuple[str, int], PromptSet],
    quick_settle: bool = False,
) -> dict[str, Any]:
    """``args.pairs`` pairs of runs, the order flipped every pair (vllm, ours, ours, vllm, ...); the medians."""
    first = args.order.split(",") + (["guidellm"] if args.guidellm else [])
    runs: dict[str, list[dict[str, Any]]] = {who: [] for who in first}
    for pair in range(args.pairs):
        for who in first if pair % 2 == 0 else first[::-1]:
            runs[who].append(
                measure_run(who, pair, url, args, metrics_urls, work, tokenizer, api_key, sets[who, pair], quick_settle)
            )
    figures = compare_figures(runs["ours"], runs["vllm"], args.tolerance) if "vllm" in runs else {}
    against = {who: against_server(runs[who]) for who in runs}
    out = {who: median_figures(runs[who]) for who in runs}
    if "guidellm" in runs:
        out["figures_guidellm"] = compare_figures(runs["ours"], runs["guidellm"], args.tolerance)
    return {
        **out,
        "runs": runs,
        "figures": figures,
        "verdict": verdict(figures) if figures else "vllm not run",
        "against_server": against,
        "verdict_vs_server": against["ours"]["verdict"],
        "verdicts": [r.get("failures") for r in runs["ours"]],
    }


def against_server(runs: list[dict[str, Any]], tolerance: float = SERVER_TOLERANCE) -> dict[str, Any]:
    """One client's requests/s set against the server's own steady rate over each of its runs: the median of
    client / server with its bootstrap 90 % interval and the verdict (``agrees`` only if the whole interval lies
    within 1 +- ``tolerance``). Runs without a server rate (too short for the export period) or void count
    nowhere; with none left the verdict is "not comparable"."""
    values = [
        (r["server"]["requests_per_s"], r["requests_per_s"]) for r in runs if r.get("server") and not r.get("void")
    ]
    if not values:
        return {"verdict": "not comparable", "runs": 0}
    ratio = pair_stats.median_ratio(values)
    return {
        **ratio,
        "verdict": pair_stats.agreement(ratio["ci90"], tolerance),
        "server_requests_per_s": statistics.median(v for v, _ in values),
    }


def _target_flags(ap: argparse.ArgumentParser) -> None:
    """What is measured: a running deployment, the echo server or the shipped config, and its warm-up."""
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running deployment's base URL")
    where.add_argument("--echo", action="store_true", help="start testkit/echo_server.py and compare on it")
    where.add_argument(
        "--shipped",
        action="store_true",
        help="deploy serve_config.yaml (ray start + serve deploy, a fresh single-node cluster, torn "
        "down after) and compare on it",
    )
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml", help="--shipped: the Serve config")
    ap.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="requests sent with vLLM's client before either measured run, prompts of their own "
        "(default: 0 on the echo server, 200 otherwise: the engines' first batches compile)",
    )
    ap.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="the deployment's metrics endpoints (default: Ray's service discovery file)",
    )


def _workload_flags(ap: argparse.ArgumentParser) -> None:
    """What every run sends, and the echo server's latencies."""
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument(
        "--requests", type=int, default=640, help="requests per run at least (more where --min-run-s needs them)"
    )
    ap.add_argument(
        "--min-run-s",
        type=float,
        default=40.0,
        help="after the warm-up, runs are sized to last at least this long at its rate (0: off)",
    )
    ap.add_argument("--input-len", type=int, default=128, help="prompt tokens, BOS included")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="--echo: the server's time to first token")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="--echo: its time between tokens")


def _protocol_flags(ap: argparse.ArgumentParser) -> None:
    """The comparison: the clients' order, the pairs, the seed, the idle gap, the tolerance."""
    ap.add_argument(
        "--order",
        default="vllm,ours",
        help="the clients, the first to run first (the order flipped every other pair); 'ours' alone with "
        "--guidellm compares ours with GuideLLM only",
    )
    ap.add_argument(
        "--pairs",
        type=int,
        default=pair_stats.MIN_PAIRS,
        help="pairs of runs (even, at least 6 unless --smoke); the figures compared are pair medians",
    )
    ap.add_argument("--smoke", action="store_true", help="allow fewer pairs (a trial; the result says so)")
    ap.add_argument("--seed", type=int, default=0, help="the prompts' seed")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=25.0,
        help="idle seconds before every run on a real deployment (Ray exports counters every 10 s)",
    )
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)


def _run_flags(ap: argparse.ArgumentParser) -> None:
    """How the run is read (the CLI's scrapes, the server's rate), GuideLLM beside, and where the results go."""
    ap.add_argument(
        "--scrape-interval", type=float, default=None, help="our CLI's --scrape-interval (default: the CLI's own, 2 s)"
    )
    ap.add_argument(
        "--record-bodies",
        type=Path,
        default=None,
        help="--echo: the echo server writes every request body it receives here (JSON lines)",
    )
    ap.add_argument(
        "--rate-interval",
        type=float,
        default=1.0,
        help="seconds between reads of the server's finished-requests counter during a run",
    )
    ap.add_argument(
        "--rate-tail-s",
        type=float,
        default=12.0,
        help="a real deployment: seconds the counter is still read after a run ends (Ray exports every "
        "few seconds; the run's last requests show up that much later)",
    )
    ap.add_argument(
        "--guidellm",
        action="store_true",
        help=f"a third client, GuideLLM {guidellm_client.VERSION} in an environment of its own "
        "(.cache/guidellm-venv, built on first use), in every pair beside the two",
    )
    ap.add_argument("--out", type=Path, default=None, help="write agreement.json and agreement.md here")


def parser() -> argparse.ArgumentParser:
    """``python -m benchmarks.bench_agreement``'s flags, in the order ``--help`` lists them."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_agreement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _target_flags(ap)
    _workload_flags(ap)
    _protocol_flags(ap)
    _run_flags(ap)
    return ap


def checked_clients(ap: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """The clients compared, in ``--order``, GuideLLM last; a command that names others exits as argparse does."""
    clients = (*args.order.split(","), *(["guidellm"] if args.guidellm else []))
    if "ours" not in clients or not set(clients) <= {"ours", "vllm", "guidellm"}:
        ap.error(f"--order: ours and vllm (either first), or ours alone with --guidellm; got {args.order!r}")
    return clients


@contextlib.contextmanager
def target(args: argparse.Namespace, tmp: Path) -> Iterator[tuple[str, list[str]]]:
    """The deployment compared on: (its base URL, its metrics endpoints); an echo server or a shipped cluster
    started for the comparison is stopped after it, whatever happened."""
    echo = shipped = None
    try:
        if args.echo:
            echo, url = start_echo(args.ttft_ms, args.itl_ms, args.record_bodies)
            metrics = [f"{url}/metrics"]
        elif args.shipped:
            from benchmarks.harness.arms import Shipped

            shipped = Shipped(args.config, tmp / "cluster").__enter__()
            url, metrics = shipped.base_url, shipped.cluster.metrics_urls
        else:
            url, metrics = args.url.rstrip("/"), args.metrics_url
        yield url, metrics
    finally:
        if echo is not None:
            echo.terminate()
            echo.wait(10)
        if shipped is not None:
            shipped.__exit__(None, None, None)


def warm_up(
    args: argparse.Namespace,
    url: str,
    tokenizer: Path,
    api_key: str | None,
    warmup: int,
    sets: dict[tuple[str, int], PromptSet],
    clients: tuple[str, ...],
    tmp: Path,
) -> dict[tuple[str, int], PromptSet]:
    """``warmup`` requests with vLLM's client, prompts of their own, not measured; where its rate needs longer runs
    for ``--min-run-s``, ``args.requests`` is raised and the prompt sets drawn again at that size (returned)."""
    log.info("warming up with %d requests (vLLM's client, prompts of their own, not measured)", warmup)
    (tmp / "warmup").mkdir()
    warm = theirs(
        url,
        tokenizer,
        args.concurrency,
        sets["warmup", 0].write_jsonl(tmp / "warmup.jsonl"),
        warmup,
        args.output_len,
        tmp / "warmup",
        api_key,
    )
    sized = run_size(args.requests, warm["requests_per_s"], args.min_run_s)
    if sized > args.requests:
        log.info(
            "%d requests per run (the warm-up's %.1f req/s for at least %.0f s)",
            sized,
            warm["requests_per_s"],
            args.min_run_s,
        )
        args.requests = sized
        sets = prompt_sets(args.pairs, args.requests, args.input_len, warmup, args.seed, clients)
    return sets


def measure(
    args: argparse.Namespace, warmup: int, clients: tuple[str, ...], sets: dict[tuple[str, int], PromptSet]
) -> dict[str, Any]:
    """The target started, the clients loaded and warmed up, every pair run (:func:`compare_on`), the target
    stopped; what :func:`compare_on` found."""
    with tempfile.TemporaryDirectory() as tmp_dir, target(args, Path(tmp_dir)) as (url, metrics):
        tmp = Path(tmp_dir)
        api_key = os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None
        tokenizer = save_tokenizer(tmp / "tokenizer")
        start_clients()
        if warmup:
            sets = warm_up(args, url, tokenizer, api_key, warmup, sets, clients, tmp)
        return compare_on(url, args, metrics, tmp, tokenizer, api_key, sets, quick_settle=args.echo)


def report(result: dict[str, Any], args: argparse.Namespace, warmup: int) -> int:
    """The run's settings recorded in ``result``, its tables and verdicts on stdout (and ``--out``); 0 where our
    CLI agrees with the server's own rate, else 1."""
    result["workload"] = {
        k: getattr(args, k) for k in ("concurrency", "requests", "input_len", "output_len", "pairs", "seed")
    }
    result["below_protocol"] = args.pairs < pair_stats.MIN_PAIRS
    result["target"] = "echo server" if args.echo else (f"{args.config} (shipped)" if args.shipped else args.url)
    result["warmup_requests"] = warmup
    result["scrape_interval_s"] = args.scrape_interval
    md = table(result)
    sys.stdout.write(
        md
        + f"\n{result['verdict'].upper()} (tolerance {args.tolerance:.0%}, {args.pairs} pairs"
        + (", below protocol" if result["below_protocol"] else "")
        + ")\n"
        + "Against the server: "
        + ", ".join(  # ours first: the verdict that decides
            f"{NAMES[who]} {a['verdict'].upper()}"
            for who, a in sorted(result["against_server"].items(), key=lambda item: item[0] != "ours")
        )
        + f" (tolerance {SERVER_TOLERANCE:.0%})\n"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "agreement.json").write_text(json.dumps(result, indent=2))
        (args.out / "agreement.md").write_text(md + "\n")
    # decided against the server (issue 47): the CLI's figure is the server's own rate within 5 %; the two clients'
    # figures against each other are shown beside it, each tool's own cost and denominator with them
    return 0 if result["verdict_vs_server"] == "agrees" else 1


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    pair_stats.check_pairs(args.pairs, smoke=args.smoke)
    command_logging()
    use_engine_env()
    warmup = args.warmup if args.warmup is not None else (0 if args.echo else 200)
    clients = checked_clients(ap, args)
    if args.guidellm:
        guidellm_client.ensure_env()
    sets = prompt_sets(args.pairs, args.requests, args.input_len, warmup, args.seed, clients)
    return report(measure(args, warmup, clients, sets), args, warmup)


if __name__ == "__main__":
    sys.exit(main())
