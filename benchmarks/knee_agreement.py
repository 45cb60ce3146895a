"""Does the stress CLI's capacity search find the knee GuideLLM's knee profile finds, on the same deployment and
prompts, and which do the server's own counts support? (issue 47, item 4)

    python -m benchmarks.knee_agreement --shipped        # serve_config.yaml in a fresh local cluster, torn down after
    python -m benchmarks.knee_agreement --url http://127.0.0.1:8000 --metrics-url http://127.0.0.1:8089/metrics

Both tools step through the same concurrencies (1, 2, 4, ... ``--max-concurrency``, ``--step-s`` seconds each) on
one deployment, one after the other (ours first, then GuideLLM, after the same idle gap), sending the same kind of
prompts (``--input-len`` tokens of random vocabulary words, exactly ``--output-len`` output tokens, streamed
completions): ours its ``bench`` scenario's own (the capacity search draws as many as its steps need;
``--prompts-file`` is for fixed-count runs), GuideLLM a file of :class:`benchmarks.harness.prompts.PromptBook` prompts,
which it reads from its start at every step (so its later steps reuse its earlier prompts, and the prefix cache
may serve them: the report says how many prompt tokens each run had from a cache).
Each names its knee by its own rule: ours the highest concurrency whose SLO goodput is within a few percent of the
best and still meets the SLO (``load_tests.judge.capacity``); GuideLLM 0.8.1's ``knee`` profile fits a rising and
a flat segment to its output-token throughput (its ``conclusions``, adaptive refinement off).

**The server's side**, fixed before the data: during both runs the server's finished-requests counter is read
every second (:mod:`benchmarks.harness.server_rate`) and each step's server rate is taken over that step's window (ours:
the step's start and length in the run, whose clock starts within a second of the call; GuideLLM: each
benchmark's start and end times). Over each run, the **server's knee** is the lowest step whose server rate
reaches 90 % of that run's highest; none when the top step still gains 10 % or more over the step below (the
server was still rising). Two knees **agree** when they are at most one step apart, a knee not found within the
steps counting as the top step (our search names the top step when its best goodput is there: the same reading);
otherwise the report says which knee lies within one step of the server's.

GuideLLM runs in its own environment (:mod:`benchmarks.harness.guidellm_client`, built on first use). Steps need the
server's rate to exist: Ray's agent exports every 10 s, so ``--step-s`` of 40 or more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.bench_agreement import REPO, cache_counters, replica_histograms
from benchmarks.harness import guidellm_client
from benchmarks.harness.inprocess_clients import save_tokenizer, start_clients, theirs
from benchmarks.harness.prompts import PromptBook
from benchmarks.harness.server_rate import RateSampler, steady_rate
from load_tests import cli as load_cli
from load_tests.command_logs import command_logging
from load_tests.observe.counters import ReplicaCounters
from load_tests.runner.run import run as load_run
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.knee_agreement")
SERVER_KNEE_SHARE = 0.9  # the server's knee: the lowest step whose rate reaches this share of the run's highest
STILL_RISING = 1.10  # no server knee when the top step's rate is at least this over the step below


def steps_up_to(top: int) -> list[int]:
    out = [1]
    while out[-1] * 2 <= top:
        out.append(out[-1] * 2)
    return out


def window_rate(samples: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The server's requests/s over ``[start, end]`` (the sampler's clock), its middle only
    (:func:`benchmarks.harness.server_rate.steady_rate`)."""
    inside = [(t, c) for t, c in samples if start <= t <= end]
    got = steady_rate(inside)
    return got["requests_per_s"] if got else None


def server_knee(rates: dict[int, float | None]) -> int | None:
    """The lowest step whose server rate reaches :data:`SERVER_KNEE_SHARE` of the highest; None when the top step
    still gains :data:`STILL_RISING` over the one below, or no step has a rate."""
    have = {c: r for c, r in sorted(rates.items()) if r}
    if not have:
        return None
    steps = sorted(have)
    best = max(have.values())
    if len(steps) >= 2 and have[steps[-1]] >= STILL_RISING * have[steps[-2]]:
        return None
    return next(c for c in steps if have[c] >= SERVER_KNEE_SHARE * best)


def at_or_beyond(knee: int | None, steps: list[int]) -> int:
    """A knee as a step: none found within the steps reads as the top step ("at or beyond it"), which is also
    what our search names when the best goodput is at its top step."""
    return steps[-1] if knee is None else knee


def within_one_step(a: int | None, b: int | None, steps: list[int]) -> bool:
    a, b = at_or_beyond(a, steps), at_or_beyond(b, steps)
    return a in steps and b in steps and abs(steps.index(a) - steps.index(b)) <= 1


def verdict(ours: int | None, theirs_: int | None, server: dict[str, int | None], steps: list[int]) -> str:
    """``agree`` when the two knees are at most one step apart (a knee not found within the steps counting as the
    top step); otherwise which of them lies within one step of the server's knee over either run."""
    if within_one_step(ours, theirs_, steps):
        both_top = at_or_beyond(ours, steps) == at_or_beyond(theirs_, steps) == steps[-1]
        return "agree" + (f": no knee below {steps[-1]} in flight" if both_top else "")
    supported = [
        name
        for name, k in (("ours", ours), ("GuideLLM's", theirs_))
        if any(within_one_step(k, s, steps) for s in server.values())
    ]
    return "disagree; the server's counts support " + (" and ".join(supported) if supported else "neither")


def run_ours(
    url: str,
    steps: list[int],
    step_s: float,
    output_len: int,
    metrics: list[str],
    work: Path,
    sampler: RateSampler,
    api_key: str | None,
) -> dict[str, Any]:
    argv = [
        "--scenario",
        "bench",
        "--url",
        url,
        "--profile",
        "sweep",
        "--concurrency",
        str(steps[-1]),
        "--step-s",
        str(step_s),
        "--mix",
        json.dumps({"max_tokens": [output_len, output_len]}),
        "--no-progress",
        "--out",
        str(work / "ours"),
        *(a for m in metrics for a in ("--metrics-url", m)),
    ]
    if api_key:
        argv += ["--api-key", api_key]
    inputs = load_cli.inputs_for(argv)
    t_call = time.monotonic()
    summary = load_run(*inputs, Console(stderr=True))
    cap = summary.capacity
    if cap is None:
        raise RuntimeError("our sweep returned no capacity result")
    rows = {}
    for s in cap.steps:
        start = t_call + s.t_start
        rows[s.concurrency] = {
            "client_requests_per_s": s.throughput.requests_per_s,
            "server_requests_per_s": window_rate(sampler.samples, start, start + s.wall_s),
        }
    return {
        "knee": cap.knee,
        "rule": "highest concurrency within knee_within of the best SLO goodput, meeting the SLO",
        "steps": rows,
        "stopped_because": cap.stopped_because,
    }


def run_guidellm(
    url: str,
    dataset: Path,
    tokenizer: Path,
    steps: list[int],
    step_s: float,
    work: Path,
    sampler: RateSampler,
    api_key: str | None,
) -> dict[str, Any]:
    report, cpu = guidellm_client.run_report(
        url, dataset, tokenizer, guidellm_client.knee(steps), {"kind": "max_duration", "seconds": step_s}, work, api_key
    )
    to_sampler = time.monotonic() - time.time()  # GuideLLM's times are the epoch's
    rows = {}
    for b, fig in zip(report["benchmarks"], guidellm_client.figures(report), strict=False):
        rows[fig["streams"]] = {
            "client_requests_per_s": fig["requests_per_s"],
            "server_requests_per_s": window_rate(
                sampler.samples, b["start_time"] + to_sampler, b["end_time"] + to_sampler
            ),
        }
    found = guidellm_client.knee_found(report) or {}
    sat = found.get("saturation_concurrency")
    return {
        "knee": int(sat) if sat is not None and found.get("status") == "ok" else None,
        "rule": "GuideLLM's knee profile: " + str(found.get("reason")),
        "analysis": found,
        "steps": rows,
        "client_cpu_s": cpu,
    }


def cached(run: dict[str, Any]) -> str:
    c = run.get("cache")
    if not c or not c["prompt_tokens"]:
        return "unknown"
    return f"{c['hit_tokens']:.0f} of {c['prompt_tokens']:.0f} ({c['hit_tokens'] / c['prompt_tokens']:.0%})"


def hits(before: Any, after: Any) -> dict[str, float] | None:
    """The prompt tokens a run asked for and those either cache tier served (None where unreadable)."""
    if before is None or after is None:
        return None
    d = after - before
    return {"prompt_tokens": d.prompt_tokens, "hit_tokens": d.hit_tokens, "requests": d.requests}


def table(result: dict[str, Any]) -> str:
    ours, theirs_ = result["ours"], result["guidellm"]
    lines = [
        "| in flight | ours req/s | server during ours | GuideLLM req/s | server during GuideLLM's |",
        "|---|---|---|---|---|",
    ]

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for c in result["steps"]:
        a, b = ours["steps"].get(c, {}), theirs_["steps"].get(c, {})
        lines.append(
            f"| {c} | {f(a.get('client_requests_per_s'))} | {f(a.get('server_requests_per_s'))} | "
            f"{f(b.get('client_requests_per_s'))} | {f(b.get('server_requests_per_s'))} |"
        )
    lines += [
        "",
        f"- ours: knee {ours['knee']} ({ours['rule']})",
        f"- GuideLLM: knee {theirs_['knee']} ({theirs_['rule']})",
        (
            f"- the server's knee over ours' run: {result['server_knee']['ours']}, over GuideLLM's: "
            f"{result['server_knee']['guidellm']} (the lowest step reaching {SERVER_KNEE_SHARE:.0%} of the run's "
            f"highest server rate; none while the top step still gains {STILL_RISING - 1:.0%})"
        ),
        f"- prompt tokens served from a cache: ours {cached(ours)}, GuideLLM {cached(theirs_)}",
        f"- verdict: {result['verdict']}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    command_logging()
    use_engine_env()
    guidellm_client.ensure_env()
    steps = steps_up_to(args.max_concurrency)
    ours, theirs_, histograms = _run_both(args, steps)
    server = {
        who: server_knee({c: r["server_requests_per_s"] for c, r in run["steps"].items()})
        for who, run in (("ours", ours), ("guidellm", theirs_))
    }
    decided = verdict(ours["knee"], theirs_["knee"], server, steps)
    result = {
        "steps": steps,
        "ours": ours,
        "guidellm": theirs_,
        "server_knee": server,
        "verdict": decided,
        "workload": {k: getattr(args, k) for k in ("max_concurrency", "step_s", "input_len", "output_len", "prompts")},
        "target": f"{args.config} (shipped)" if args.shipped else args.url,
        "replicas_read": sorted(histograms or {}),
    }
    md = table(result)
    sys.stdout.write(md + "\n")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "knee.json").write_text(json.dumps(result, indent=2, default=str))
        (args.out / "knee.md").write_text(md + "\n")
    return 0 if decided.startswith("agree") else 1


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.knee_agreement",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running deployment's base URL")
    where.add_argument("--shipped", action="store_true", help="deploy serve_config.yaml in a fresh local cluster")
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml", help="--shipped: the Serve config")
    ap.add_argument("--metrics-url", action="append", default=[], help="--url: the deployment's metrics endpoints")
    ap.add_argument("--max-concurrency", type=int, default=256)
    ap.add_argument("--step-s", type=float, default=45.0, help="seconds per step, both tools")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=20000, help="prompts in the file both tools read")
    ap.add_argument("--settle-s", type=float, default=25.0, help="idle seconds before each tool's run")
    ap.add_argument("--warmup", type=int, default=200, help="requests with vLLM's client before either run")
    ap.add_argument("--out", type=Path, default=None, help="write knee.json and knee.md here")
    return ap.parse_args(argv)


def _run_both(
    args: argparse.Namespace, steps: list[int]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, ReplicaCounters] | None]:
    """On the target (``--url``, or the shipped config deployed for the run and torn down after it): the warm-up,
    our capacity search and GuideLLM's, and the replicas' histograms after both."""
    book = PromptBook(0)
    prompts = book.unique("knee", args.prompts, args.input_len)
    warm = book.unique("warmup", args.warmup, args.input_len)
    api_key = os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None
    shipped = None
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        try:
            if args.shipped:
                from benchmarks.harness.arms import Shipped

                shipped = Shipped(args.config, work / "cluster").__enter__()
                url, metrics = shipped.base_url, shipped.cluster.metrics_urls
            else:
                url, metrics = args.url.rstrip("/"), args.metrics_url
            tokenizer = save_tokenizer(work / "tokenizer")
            start_clients()
            if args.warmup:
                (work / "warmup").mkdir()
                theirs(
                    url,
                    tokenizer,
                    32,
                    warm.write_jsonl(work / "warmup.jsonl"),
                    args.warmup,
                    args.output_len,
                    work / "warmup",
                    api_key,
                )
            theirs_file = guidellm_client.write_dataset(prompts.prompts, args.output_len, work / "prompts-g.jsonl")
            ours, theirs_ = _searches(args, steps, url, metrics, tokenizer, theirs_file, work, api_key)
            histograms = replica_histograms(metrics)
        finally:
            if shipped is not None:
                shipped.__exit__(None, None, None)
    return ours, theirs_, histograms


def _searches(
    args: argparse.Namespace,
    steps: list[int],
    url: str,
    metrics: list[str],
    tokenizer: Path,
    theirs_file: Path,
    work: Path,
    api_key: str | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Our capacity search, then GuideLLM's knee profile, each after an idle pause and with the prefix cache's hits
    over it, under one server rate sampler."""
    with RateSampler(metrics, interval_s=1.0) as sampler:
        time.sleep(args.settle_s)
        log.info("our capacity search: %s in flight, %.0f s each", steps, args.step_s)
        before = cache_counters(metrics)
        ours = run_ours(url, steps, args.step_s, args.output_len, metrics, work, sampler, api_key)
        time.sleep(args.settle_s)
        ours["cache"] = hits(before, cache_counters(metrics))
        log.info("GuideLLM's knee profile: the same steps")
        before = cache_counters(metrics)
        theirs_ = run_guidellm(url, theirs_file, tokenizer, steps, args.step_s, work, sampler, api_key)
        time.sleep(args.settle_s)
        theirs_["cache"] = hits(before, cache_counters(metrics))
    return ours, theirs_


if __name__ == "__main__":
    sys.exit(main())
