"""What fuzz at depth costs: the engine with the ``fuzz_layer`` patch against the same engine without it.

    python -m benchmarks.layer_cost [--pairs 8] [--requests 200] [--out docs/benchmarks/layer_cost]

The question (issue: neutral traffic must not pay for the feature): does an
engine with the layer hooks built in serve *neutral* requests as fast as the
one without them, eager and compiled; and what does a batch fuzzed at a layer
cost next to the same batch fuzzed at the embeddings and unfuzzed.

Engines (offline ``LLM`` in child processes, each kept up for the whole run,
the fixture model, prefix caching on, pinned as ``patch_overhead`` pins
them): ``eager`` and ``compiled``, each ``with`` every patch and ``without``
the ``fuzz_layer`` patch (``FUZZSERVE_PATCHES_OFF=fuzz_layer``: the embedding
fuzz still on, so the difference is the layer hooks alone), each warmed up
with one full-size run of every workload it will serve. Workload:
``--requests`` distinct prompts of 128 tokens, 64 out (ignore_eos), fresh
prompts per pair (the same for both arms of a pair: nothing is answered from
the prefix cache). Per pair and mode the two arms run back to back, ``with``
first in even pairs and ``without`` first in odd ones (ABBA), so the host's
drift and the position cancel; the figure is the median over pairs of
``with / without`` with its percentile-bootstrap 90 % interval
(``benchmarks.harness.pair_stats``), for requests per second and CPU per
request.

On the ``with`` engines three fuzzed variants of the same prompts follow in
each pair: every request gaussian at s = 1e-4 (noise computed for every token,
too small to change the text, so varied text costs nothing here) at the
embeddings (``noise@0``), after the first decoder layer (``noise@1``) and
after the last (``noise@-1``), each divided by that pair's neutral run on the
same engine.

Results: ``layer_cost.json`` (every run) and ``layer_cost.md``. A benchmark:
nothing here asserts a target; docs/fuzz.md states the goal and the verdict.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness.host import cpu_model
from benchmarks.harness.pair_stats import median_ratio
from benchmarks.harness.targets import ENGINE, EngineKwargs
from benchmarks.patch_overhead import _tree_cpu
from benchmarks.serve_stack import REPO, SETTLE_S, _machine, prompts
from load_tests.command_logs import command_logging
from patches.framework.switches import OFF_ENV
from serve_app.engine.engine_env import ENGINE_ENV

if TYPE_CHECKING:
    from testkit.engine_host import EngineHost

log = logging.getLogger("fuzzserve.benchmarks")

MODES = ("eager", "compiled")
ARMS = ("without", "with")
NOISE = 1e-4  # x the token's RMS: computed for every token, too small to change the greedy text
FUZZED = {"noise@0": 0, "noise@1": 1, "noise@-1": -1}
GOAL = 0.98  # neutral req/s with the layer hooks / without them, the whole 90 % interval at or above


def engine_env(arm: str, omp_bind: str) -> dict[str, str]:
    env = {**ENGINE_ENV, "VLLM_CPU_OMP_THREADS_BIND": omp_bind}
    if arm == "without":
        env[OFF_ENV] = "fuzz_layer"
    return env


def params(n: int, out_tokens: int, layer: int | None) -> list[dict[str, Any]]:
    base: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True, "max_tokens": out_tokens}
    if layer is None:
        return [base] * n
    xargs = {"fuzz_strength": NOISE, "fuzz_mode": "gaussian", "fuzz_layer": layer}
    return [{**base, "extra_args": {**xargs, "fuzz_seed": i % 4}} for i in range(n)]


def plan(pairs: int) -> list[tuple[int, str, str, str]]:
    """(pair, mode, arm, workload) in run order: per pair and mode the two arms ABBA, then the fuzzed variants."""
    order = []
    for p in range(pairs):
        for mode in MODES:
            for arm in ARMS if p % 2 == 0 else tuple(reversed(ARMS)):
                order.append((p, mode, arm, "neutral"))
            order += [(p, mode, "with", w) for w in FUZZED]
    return order


def _ratio(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    """pair_stats' median ratio over the pairs whose reference is positive (a tiny run can measure 0 ms of CPU:
    clock ticks); its figures None where no pair has one."""
    kept = [(a, b) for a, b in pairs if a > 0]
    if not kept:
        return {"pairs": 0, "ratios": [], "median": None, "ci90": [None, None]}
    return dict(median_ratio(kept))


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the neutral ratio with / without (req/s and CPU per request), and each fuzzed variant / neutral."""
    rows = []
    by = {(r["pair"], r["mode"], r["arm"], r["workload"]): r for r in runs}
    for mode in MODES:
        pairs = sorted({r["pair"] for r in runs if r["mode"] == mode})
        comparisons = [("neutral: with / without", ("without", "neutral"), ("with", "neutral"))]
        comparisons += [(f"{w} / neutral", ("with", "neutral"), ("with", w)) for w in FUZZED]
        for compare, ref, cand in comparisons:
            for figure in ("req_per_s", "cpu_ms_per_req"):
                pr = _ratio([(by[(p, mode, *ref)][figure], by[(p, mode, *cand)][figure]) for p in pairs])
                rows.append({"mode": mode, "compare": compare, "figure": figure, **pr})
    return rows


def verdict(row: dict[str, Any]) -> str:
    """The goal on neutral req/s: met only when the whole 90 % interval is at or above :data:`GOAL`."""
    low = row["ci90"][0]
    return "met" if low is not None and low >= GOAL else "not met"


def _interval(row: dict[str, Any]) -> str:
    if row["median"] is None:
        return "-"
    return f"{row['median']:.3f} [{row['ci90'][0]:.3f}, {row['ci90'][1]:.3f}]"


def markdown(meta: dict[str, Any], runs: list[dict[str, Any]], table: list[dict[str, Any]]) -> str:
    w = meta["workload"]
    med = {
        (r["mode"], r["arm"], r["workload"]): sorted(
            x["req_per_s"] for x in runs if (x["mode"], x["arm"], x["workload"]) == (r["mode"], r["arm"], r["workload"])
        )
        for r in runs
    }
    lines = [
        "# What fuzz at depth costs",
        "",
        f"`{meta['command']}` on {meta.get('cpu', '?')}, {meta['machine']}, {meta['date']}. Model: {meta['model']}.",
        "",
        (
            f"Offline `LLM.generate`, {w['requests']} distinct prompts of {w['prompt_tokens']} tokens, "
            f"{w['output_tokens']} out (ignore_eos), fresh per pair; {w['pairs']} pairs, the two arms ABBA per pair "
            f"and mode; `VLLM_CPU_OMP_THREADS_BIND={w['omp_bind']}`, frontend and EngineCore on cores "
            f"`{w['host_cores'] or 'any'}`. `with`: every patch; `without`: `FUZZSERVE_PATCHES_OFF=fuzz_layer`. "
            "Median over pairs of the ratio, [percentile-bootstrap 90 % interval]."
        ),
        "",
        "| mode | compared | req/s | CPU per request | goal (neutral req/s >= 0.98, whole interval) |",
        "|---|---|---|---|---|",
    ]
    for mode in MODES:
        for compare in dict.fromkeys(r["compare"] for r in table if r["mode"] == mode):
            rps = next(r for r in table if (r["mode"], r["compare"], r["figure"]) == (mode, compare, "req_per_s"))
            cpu = next(r for r in table if (r["mode"], r["compare"], r["figure"]) == (mode, compare, "cpu_ms_per_req"))
            goal = verdict(rps) if compare.startswith("neutral") else ""
            lines.append(f"| {mode} | {compare} | {_interval(rps)} | {_interval(cpu)} | {goal} |")
    lines += [
        "",
        "Median req/s of each arm's runs:",
        "",
        "| mode | arm | workload | req/s (median of runs) |",
        "|---|---|---|---|",
    ]
    for (mode, arm, workload), xs in med.items():
        lines.append(f"| {mode} | {arm} | {workload} | {xs[len(xs) // 2]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.pairs < 2 or args.pairs % 2:
        ap.error("--pairs: an even number, at least 2")
    command_logging()
    runs = _run(args)
    table = summarize(runs)
    meta = _meta(args, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "layer_cost.json").write_text(json.dumps({"meta": meta, "runs": runs, "table": table}, indent=2))
    (args.out / "layer_cost.md").write_text(markdown(meta, runs, table))
    log.info("wrote %s", args.out / "layer_cost.md")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=8, help="ABBA pairs (even)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--omp-bind", default="0", help="VLLM_CPU_OMP_THREADS_BIND for every engine")
    ap.add_argument(
        "--host-cores",
        default="1" if len(os.sched_getaffinity(0)) > 1 else "",
        help="comma-separated cores for each engine's frontend and EngineCore ('' = not pinned)",
    )
    ap.add_argument("--settle-s", type=float, default=SETTLE_S, help="pause before each run")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "layer_cost")
    return ap


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (mode, arm) engine up and warmed for the whole run, then the ABBA plan: one record per run."""
    from rich.progress import Progress

    from fixture_model.build import ensure_model
    from testkit.engine_host import EngineHost

    model = ensure_model()
    host_cores = [int(c) for c in args.host_cores.split(",")] if args.host_cores else None
    fresh = {p: prompts(args.requests, args.prompt_tokens, "plain", seed=7000 + p) for p in range(args.pairs)}
    # A full-size warm-up run per engine and workload before anything is measured: a first run found an eager
    # engine still speeding up over its first pairs (119 -> 159 req/s) after 8 warm-up prompts, which decided
    # the early pairs' ratios.
    warm = prompts(args.requests, args.prompt_tokens, "plain", seed=1)
    hosts: dict[tuple[str, str], EngineHost] = {}
    runs: list[dict[str, Any]] = []
    try:
        for mode in MODES:
            for arm in ARMS:
                log.info("starting engine %s/%s", mode, arm)
                kwargs: EngineKwargs = {**ENGINE, "enforce_eager": mode == "eager"}
                host = EngineHost(env=engine_env(arm, args.omp_bind), model=str(model), cpus=host_cores, **kwargs)
                hosts[(mode, arm)] = host
                host.generate(warm, params(len(warm), args.output_tokens, None))
                if arm == "with":
                    for depth in FUZZED.values():
                        host.generate(warm, params(len(warm), args.output_tokens, depth))
        order = plan(args.pairs)
        with Progress() as progress:
            task = progress.add_task("layer cost", total=len(order))
            for p, mode, arm, workload in order:
                run = _measure(hosts[(mode, arm)], fresh[p], FUZZED.get(workload), args)
                runs.append({"pair": p, "mode": mode, "arm": arm, "workload": workload, **run})
                progress.advance(task)
    finally:
        for h in hosts.values():
            h.close()
    return runs


def _measure(host: EngineHost, ps: list[str], layer: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """One run on one engine (fuzzed at ``layer``, or not): its wall time, rate, CPU per request and tokens."""
    time.sleep(args.settle_s)
    front0, engine0 = _tree_cpu(host.pid)
    t0 = time.perf_counter()
    outs = host.generate(ps, params(len(ps), args.output_tokens, layer))
    wall = time.perf_counter() - t0
    front1, engine1 = _tree_cpu(host.pid)
    return {
        "wall_s": wall,
        "req_per_s": len(outs) / wall,
        "cpu_ms_per_req": 1000 * (front1 + engine1 - front0 - engine0) / len(outs),
        "tokens": sum(len(o["token_ids"]) for o in outs),
    }


def _meta(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.layer_cost " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "cpu": cpu_model(),
        "model": "fixture (hidden 128 x 2 layers)",
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "pairs": args.pairs,
            "omp_bind": args.omp_bind,
            "host_cores": args.host_cores,
        },
    }


if __name__ == "__main__":
    raise SystemExit(main())
