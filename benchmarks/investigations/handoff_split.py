r"""Where the hand-offs between vLLM's frontend and EngineCore go, per request, on the vs_vllm arms.

    python -m benchmarks.investigations.handoff_split          # plain vs engine, 2 pairs, 1 and 8 in flight
    python -m benchmarks.investigations.handoff_split --arms engine,shipped --requests 8:400 --request-rate 15

``benchmarks.vs_vllm`` splits each server's mean TTFT with the server's own
histograms into queue, prefill and the rest, the *hand-offs* (the request
into EngineCore and its first token back), and found the engine's hand-offs
3-5 ms longer than plain vLLM's at 8 in flight. vLLM exports only those
differences; this benchmark runs the same arms (:mod:`benchmarks.harness.arms`),
the same cold workload (every prompt unique, a warm-up of its own, the same
``vllm bench serve`` client, :func:`benchmarks.harness.phase.run_phase`, which also
voids a run that shows any cache hit), with every vLLM frontend traced by
:mod:`benchmarks.investigations.handoff_hooks` (vLLM's own server, or the shipped stack's
engine replica), and splits each request's server TTFT into:

=============  ==============================================================
``front_in``   vLLM's arrival of the request until the frontend sends it to EngineCore
``in_step``    of the rest until EngineCore queues it: waiting for the step that was running when it was sent
``to_core``    the remainder of that: transit, EngineCore's input thread, its loop between steps
``queue``      EngineCore queued until scheduled (the histogram's queue time)
``prefill``    scheduled until EngineCore built the step's outputs (the histogram's prefill time)
``from_core``  those outputs until the frontend's output loop has them: EngineCore's output thread,
               ZMQ, the frontend's event loop
=============  ==============================================================

``in_step`` is read off the step outputs the trace also records: the last
step EngineCore finished before it queued the request, if that step ended
after the request was sent, is the one the request waited for. The six parts
sum to ``got - arrival``, which the report checks against the TTFT vLLM itself
records (``ttft``; their difference is the clocks' conversion, a few µs).
Beside them, ``outside``: the client's mean TTFT (vLLM's bench) minus the
server's, i.e. HTTP, the API server before vLLM's renderer and, on the
shipped stack, HAProxy, Ray's replica and the guard.

Per run, each part's mean over the run's requests; per arm, the median over
its runs (blocks ABBA, :func:`benchmarks.harness.pair_stats.block_order`); beside it
the step cycle (time between two step outputs) and the share of requests that
waited for a step. And the whole first token, client clock to client clock, in
stages from the client through HAProxy, Ray's replica, vLLM's app and back
(:mod:`benchmarks.investigations.request_timeline`: each request joined to the
client's by its prompt), for the bunches' first requests and for all.
Results: ``handoffs.json`` and ``handoffs.md`` in ``--out``.
This is a benchmark, not a test: it asserts no target (tests/test_handoff_split.py
checks the split on planted traces, the hooks on vLLM's real frontend classes,
and that vLLM loads them as a plugin only where the benchmark says).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import client_priority, pair_stats
from benchmarks.harness.arms import (
    ProtocolError,
    Shipped,
    VllmServer,
    load_config,
    make_arm,
    require_no_ray,
    slug,
    split_arms,
)
from benchmarks.harness.host import HostCpuSampler, machine
from benchmarks.harness.phase import run_phase
from benchmarks.harness.prompts import PromptSet
from benchmarks.harness.runs import Run
from benchmarks.harness.stopping import stop_on_term
from benchmarks.harness.workload import Workload, local_pool_tokens, parse_requests, prompt_plan
from benchmarks.investigations import request_timeline
from benchmarks.investigations.handoff_hooks import load_trace, plugin_env
from benchmarks.vs_vllm import REPO
from load_tests.command_logs import command_logging
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.handoff_split")

PARTS = ("front_in", "in_step", "to_core", "queue", "prefill", "from_core")
DEFAULT_OUT = REPO / "docs" / "benchmarks" / "handoff_split"


# ----------------------------------------------------------------------------- the split (pure)
def split_trace(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(first-token records, step records) of a trace's records, each in the order written."""
    requests: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for record in records:
        if "edge" not in record:  # the HTTP edges' records: request_timeline reads them
            (steps if "step" in record else requests).append(record)
    return requests, steps


def split_request(record: dict[str, Any], step_ends: list[float]) -> dict[str, float] | None:
    """One request's parts in ms (:data:`PARTS`, plus ``check``: the parts' sum minus vLLM's own TTFT), or None
    when the trace lacks a timestamp for it. ``step_ends``: every step output's timestamp, sorted."""
    if any(record.get(k) is None for k in ("arrival", "sent", "queued", "scheduled", "core_out", "got")):
        return None
    sent, queued = record["sent"], record["queued"]
    i = bisect.bisect_right(step_ends, queued) - 1  # the last step that ended before the request was queued
    step_end = step_ends[i] if i >= 0 else None
    waited = step_end is not None and step_end > sent
    ms = {
        "front_in": sent - record["arrival"],
        "in_step": (step_end - sent) if waited else 0.0,
        "to_core": (queued - step_end) if waited else queued - sent,
        "queue": record["scheduled"] - queued,
        "prefill": record["core_out"] - record["scheduled"],
        "from_core": record["got"] - record["core_out"],
    }
    out = {k: 1000 * v for k, v in ms.items()}
    out["check"] = 1000 * (sum(ms.values()) - record["ttft"]) if record.get("ttft") else float("nan")
    out["waited"] = 1.0 if waited else 0.0
    return out


def summarize(requests: list[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """One run: each part's mean over its requests (ms), the share that waited for a step, the step cycle.

    Each request is set against the steps of its own frontend's engine (records carry the frontend's pid; a
    trace of several replicas interleaves their steps)."""
    by_engine: dict[Any, list[float]] = {}
    for s in steps:
        by_engine.setdefault(s.get("pid"), []).append(s["step"])
    for ends in by_engine.values():
        ends.sort()
    rows = [r for r in (split_request(q, by_engine.get(q.get("pid"), [])) for q in requests) if r is not None]
    if not rows:
        return {"requests": 0}
    out: dict[str, Any] = {"requests": len(rows), "untraced": len(requests) - len(rows)}
    for k in (*PARTS, "check"):
        out[k] = statistics.fmean(r[k] for r in rows)
    out["server"] = sum(out[k] for k in PARTS)
    out["waited_share"] = statistics.fmean(r["waited"] for r in rows)
    t0 = min(q["arrival"] for q in requests)
    t1 = max(q["got"] for q in requests)
    cycles, out["steps"] = [], 0
    for ends in by_engine.values():
        inside = [t for t in ends if t0 <= t <= t1]
        cycles += [1000 * (b - a) for a, b in itertools.pairwise(inside)]
        out["steps"] += len(inside)
    out["step_cycle_ms"] = statistics.median(cycles) if cycles else None
    out["step_cycle_mean_ms"] = statistics.fmean(cycles) if cycles else None
    return out


def partition(
    requests: list[dict[str, Any]], steps: list[dict[str, Any]], counts: list[int]
) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """Split a phase's trace into its consecutive runs: ``counts`` requests each, in the order their first tokens
    came (the runs of a phase follow one another, each done before the next starts); each run's steps are those
    between its first arrival and its last first token."""
    if sum(counts) != len(requests):
        raise ProtocolError(f"the trace holds {len(requests)} first tokens, the runs sent {sum(counts)}")
    out, at = [], 0
    for n in counts:
        mine = requests[at : at + n]
        at += n
        t0, t1 = min(q["arrival"] for q in mine), max(q["got"] for q in mine)
        out.append((mine, [s for s in steps if t0 <= s["step"] <= t1]))
    return out


def by_arm(results: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """label -> arm -> each figure's median over the arm's (non-void) runs."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for label in dict.fromkeys(r["label"] for r in results):
        for arm in dict.fromkeys(r["arm"] for r in results):
            mine = [
                r["split"]
                for r in results
                if r["label"] == label and r["arm"] == arm and not r["void"] and r["split"].get("requests")
            ]
            if mine:
                out.setdefault(label, {})[arm] = {
                    k: statistics.median(v)
                    for k in (*PARTS, "server", "check", "waited_share", "step_cycle_ms", "client", "outside")
                    if (v := [m[k] for m in mine if m.get(k) is not None])
                }
                out[label][arm]["runs"] = len(mine)
                out[label][arm]["requests"] = sum(m["requests"] for m in mine)
    return out


def markdown(meta: dict[str, Any], results: list[dict[str, Any]]) -> str:
    table = by_arm(results)
    lines = [
        f"# hand-off split: {', '.join(meta['arms'])} ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Host: {meta['machine']}.",
        "",
        "Offered load: "
        + (
            f"{meta['request_rate']:g} requests/s (Poisson), in flight capped at each run's concurrency"
            if meta.get("request_rate")
            else "all at once, each run's concurrency in flight"
        )
        + ".",
        "",
        (
            "Each cell: the median over the arm's runs of the run's mean, ms (server side, vLLM's clocks; "
            "`check`: the parts' sum minus vLLM's own TTFT)."
        ),
        "",
        "| run | arm | runs | requests | " + " | ".join(PARTS) + " | server TTFT | check | waited for a step "
        "| step cycle p50 | client TTFT (mean) | outside |",
        "|" + "---|" * (len(PARTS) + 10),
    ]
    for label, arms in table.items():
        for arm, f in arms.items():
            cells = " | ".join(f"{f[k]:.2f}" if k in f else "-" for k in PARTS)
            lines.append(
                f"| {label} | {arm} | {f['runs']} | {f['requests']} | {cells} | {f.get('server', 0):.2f} | "
                f"{f.get('check', float('nan')):.3f} | {100 * f.get('waited_share', 0):.0f} % | "
                f"{f.get('step_cycle_ms') or float('nan'):.2f} | {f.get('client', float('nan')):.2f} | "
                f"{f.get('outside', float('nan')):.2f} |"
            )
    lines += [
        "",
        "Every run:",
        "",
        "| pair | arm | run | requests | client TTFT p50 | req/s | " + " | ".join(PARTS) + " | void |",
        "|" + "---|" * (len(PARTS) + 7),
    ]
    for r in results:
        s = r["split"]
        cells = " | ".join(f"{s[k]:.2f}" if k in s else "-" for k in PARTS)
        lines.append(
            f"| {r['pair']} | {r['arm']} | {r['label']} | {s.get('requests', 0)} | {r['ttft_p50_ms']:.1f} | "
            f"{r['req_per_s']:.1f} | {cells} | {r['void'] or ''} |"
        )
    lines += timeline_markdown(results)
    return "\n".join(lines) + "\n"


def run_timeline(client_file: Path, prompts_file: Path, edges, firsts) -> dict[str, Any]:
    """A run's stage means (:mod:`benchmarks.investigations.request_timeline`), or ``{"error": why}`` where its
    client file and the trace do not join."""
    try:
        client = json.loads(client_file.read_text())
        prompts = request_timeline.read_prompts(prompts_file)
        rows = request_timeline.join(client, prompts, edges, firsts)
        return request_timeline.summarize(client, rows, request_timeline.GAP_MS / 1000)
    except (OSError, request_timeline.JoinError) as e:
        return {"error": str(e)}


def timeline_markdown(results: list[dict[str, Any]]) -> list[str]:
    """Per run label and arm, each stage's median over the arm's runs of the run's mean, first requests and all."""
    stages = request_timeline.STAGES
    lines = [
        "",
        (
            "Request by request, client clock to client clock (`request_timeline`; `first`: the bunches' first "
            "requests; the median over the arm's runs of each run's mean, ms):"
        ),
        "",
        "| run | arm | requests | " + " | ".join(stages) + " | TTFT (mean) |",
        "|" + "---|" * (len(stages) + 4),
    ]
    for label in dict.fromkeys(r["label"] for r in results):
        for arm in dict.fromkeys(r["arm"] for r in results):
            mine = [
                r["timeline"]
                for r in results
                if r["label"] == label and r["arm"] == arm and not r["void"] and "all" in r.get("timeline", {})
            ]
            for which in ("first", "all") if mine else ():
                med = {k: statistics.median(m[which][k] for m in mine) for k in (*stages, "ttft")}
                n = sum(m[which]["requests"] for m in mine)
                cells = " | ".join(f"{med[k]:.1f}" for k in stages)
                lines.append(f"| {label} | {arm} ({which}) | {n} | {cells} | {med['ttft']:.1f} |")
    parts: tuple[str, ...] = request_timeline.FRONT_PARTS
    marked = [r for r in results if not r["void"] and all(k in r.get("timeline", {}).get("all", {}) for k in parts)]
    way = request_timeline.TO_ENGINE_PARTS  # to_engine's own parts, where every marked run has them
    parts += way if marked and all(k in r["timeline"]["all"] for r in marked for k in way) else ()
    if marked:
        lines += ["", "`front_in` in parts, where vLLM's renderer was marked (ms, as above):", ""]
        lines += ["| run | arm | " + " | ".join(parts) + " |", "|" + "---|" * (len(parts) + 2)]
        for label in dict.fromkeys(r["label"] for r in marked):
            for arm in dict.fromkeys(r["arm"] for r in marked):
                mine = [r["timeline"] for r in marked if r["label"] == label and r["arm"] == arm]
                for which in ("first", "all") if mine else ():
                    cells = " | ".join(f"{statistics.median(m[which][k] for m in mine):.1f}" for k in parts)
                    lines.append(f"| {label} | {arm} ({which}) | {cells} |")
    errors = [
        f"- pair {r['pair']} {r['arm']} {r['label']}: {r['timeline']['error']}"
        for r in results
        if "error" in r.get("timeline", {})
    ]
    return lines + (["", "Runs whose requests did not join:", "", *errors] if errors else [])


# ----------------------------------------------------------------------------- driver
def traced(arm: VllmServer | Shipped, trace: Path) -> VllmServer | Shipped:
    """The arm, its vLLM processes started with :mod:`benchmarks.investigations.handoff_hooks` as a plugin writing
    to ``trace`` (vLLM's server: its environment; the shipped stack: its cluster's, which Ray's workers inherit)."""
    if not isinstance(arm, (VllmServer, Shipped)):
        raise ProtocolError(f"{arm!r}: not an arm of benchmarks.harness.arms")
    arm.env.update(plugin_env(trace, arm.env.get("PYTHONPATH") or os.environ.get("PYTHONPATH")))
    return arm


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    arms = split_arms(args.arms)
    command_logging()
    stop_on_term()  # a stopped run (SIGTERM) unwinds like Ctrl-C: what it started is stopped
    use_engine_env()
    pair_stats.check_pairs(args.pairs, smoke=True)
    require_no_ray("before the benchmark")
    from fixture_model.build import ensure_model

    model = ensure_model()
    config = load_config(args.config)
    workload = Workload(
        name="cold",
        requests=parse_requests(args.requests),
        chat=parse_requests(args.chat) if args.chat else {},
        warmup_prompts=args.warmup_prompts,
        request_rate=args.request_rate,
        client_sched=client_priority.choose(client_priority.FIFO)[0],
    )
    plan = prompt_plan(workload, args.pairs, args.seed, local_pool_tokens(config, model))
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-handoffs-"))
    args.out.mkdir(parents=True, exist_ok=True)
    log.info("server logs, traces, prompts and raw client results in %s", work)
    meta = _meta(args, argv, arms, workload)
    results: list[dict[str, Any]] = []
    with HostCpuSampler() as sampler:
        for pair, stack in pair_stats.block_order(arms, args.pairs):
            trace = work / f"{slug(stack)}-{pair}.trace.jsonl"
            with traced(make_arm(stack, config, model, work / f"{slug(stack)}-{pair}"), trace) as arm:
                runs: list[Run] = run_phase(arm, stack, pair, workload, plan, model, work, sampler)
            results += _block_results(stack, pair, runs, trace, plan, work)
            (args.out / "handoffs.json").write_text(
                json.dumps({"meta": meta, "by_arm": by_arm(results), "runs": results}, indent=1)
            )
            (args.out / "handoffs.md").write_text(markdown(meta, results))
    print(markdown(meta, results))
    return 2 if any(r["void"] for r in results) else 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.handoff_split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--arms", default="plain,engine", help="arms of benchmarks.vs_vllm, comma-separated")
    ap.add_argument("--pairs", type=int, default=2, help="blocks of every arm, ABC then CBA (even)")
    ap.add_argument("--requests", default="1:128,8:400", help="requests in flight:prompts per run, comma-separated")
    ap.add_argument("--chat", default="8:400,32:800", help="chat completions runs, in flight:prompts ('' for none)")
    ap.add_argument("--warmup-prompts", type=int, default=100)
    ap.add_argument(
        "--request-rate",
        type=float,
        default=None,
        help="measured runs: requests per second offered, Poisson (vLLM's bench), in flight still capped: "
        "the arms then stream the same load through their frontends",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", type=Path, default=REPO / "serve_config.yaml")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return ap.parse_args(argv)


def _meta(args: argparse.Namespace, argv: list[str] | None, arms: list[str], workload: Workload) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.investigations.handoff_split "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "arms": arms,
        "pairs": args.pairs,
        "requests": {str(k): v for k, v in workload.requests.items()},
        "warmup_prompts": args.warmup_prompts,
        "request_rate": args.request_rate,
    }


def _block_results(
    stack: str, pair: int, runs: list[Run], trace: Path, plan: dict[tuple[int, str], PromptSet], work: Path
) -> list[dict[str, Any]]:
    """One block's runs, each with its split (from the block's trace, past the warm-up's requests) and timeline."""
    records = load_trace(trace)
    requests, steps = split_trace(records)
    edges, firsts = request_timeline.index_records(records)
    warm = len(requests) - sum(r.completed for r in runs)
    parts = partition(requests, steps, [warm] + [r.completed for r in runs])[1:]
    results = []
    for run, (reqs, stps) in zip(runs, parts, strict=False):
        split = summarize(reqs, stps)
        if split.get("requests"):
            split["client"] = run.ttft_ms["mean"]
            split["outside"] = run.ttft_ms["mean"] - split["server"]
        timeline = run_timeline(
            work / f"{slug(stack)}-{pair}-{run.attempt}-{run.label}.json",
            work / "prompts" / f"{plan[pair, run.label].name}.jsonl",
            edges,
            firsts,
        )
        results.append(
            {
                "arm": stack,
                "pair": pair,
                "label": run.label,
                "void": run.void,
                "ttft_p50_ms": run.ttft_ms["p50"],
                "req_per_s": run.req_per_s,
                "split": split,
                "timeline": timeline,
            }
        )
        log.info(
            "pair %d %s %s: %s",
            pair,
            stack,
            run.label,
            ", ".join(f"{k} {split.get(k, float('nan')):.2f}" for k in PARTS),
        )
    return results


if __name__ == "__main__":
    sys.exit(main())
