"""What the patches cost inside the engine: stock vLLM vs patched, same prompts, interleaved.

    python -m benchmarks.patch_overhead [--rounds 5] [--requests 200] [--out docs/benchmarks]

The serving-stack benchmark measures the patches through Ray Serve, where run
to run noise on 2 cores (+-20 %) hides a few percent. This one removes
everything but the engine: offline ``LLM.generate`` in child processes, one
engine per configuration kept up for the whole run, rounds interleaved
(off, on, on+offload, on-worker, off, ...), each patched run divided by the same
round's stock run.

Engines: ``off`` (``FUZZSERVE_PATCHES_OFF=all``: stock vLLM), ``on`` (fuzz,
accounting, cpu_inproc; offloading off), ``on-worker`` (``on`` with the
``cpu_inproc`` patch off: the model in a worker process, as stock vLLM runs
it on CPU; unfuzzed workloads only), ``on+offload`` (every patch, native KV
offloading to a 0.25 GiB host pool). Workloads: ``decode`` (``--prompt-tokens``
128 in, 64 out with ``ignore_eos``: request throughput), ``prefill`` (the same
prompts, 1 token out: time to first token of a full batch), each at s = 0,
and on the patched engines two fuzzed variants of both:

* ``+fuzz``: every request fuzzed with the load tests' strength/mode mix;
* ``+noise``: every request gaussian at s = 1e-4. The whole noise path runs
  for every token (more than the mix, where half the requests scale), but
  the generated text stays the unfuzzed one (the run records how many
  outputs are identical). This separates what the fuzz *machinery* costs
  from what *different text* costs: the fixture model's unfuzzed greedy
  output is repetitive (~8 distinct tokens in 64), fuzzed output is not,
  and vLLM's incremental detokenizer costs more per token on varied text.

Every (round, workload kind) gets fresh prompts, the same for every engine
and every fuzz variant of that round: no run can answer from the prefix
cache or offload tier what an earlier run computed (fuzzed requests carry
their own cache salt, so they share nothing with the unfuzzed run either).

Placement is pinned. The worker's compute threads (``--omp-bind``, default
core 0 for every engine): left to ``auto`` on 2 cores, vLLM gives an engine
*without* a KV connector one OpenMP thread and reserves the other core, but
an engine *with* one (as offloading is) both cores, which doubles its
prefill speed and would be mistaken for a property of the patches. And the
engine's other processes, ``LLM``'s frontend and EngineCore
(``--host-cores``, default core 1): left to float, they sometimes share the
worker's core and sometimes not, which scattered single runs of the same
engine by 0.5x-1.4x.

Runs are also kept apart (``--settle-s``, 1.5 s): after its last step a
stock engine's EngineCore and worker keep spinning for 1 s (upstream's busy
window), so without the pause the first second of every run competed with
the previous engine's spin, and which engine ran after a stock one decided
which one looked slower (the measurements: docs/benchmarks.md, "Patches
inside the engine").

Results: ``patch_overhead.json`` and ``patch_overhead.md`` in ``--out``.
This is a benchmark, not a test: nothing here asserts a target.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.harness.targets import ENGINE, OFFLOAD, EngineKwargs
from benchmarks.serve_stack import REPO, SETTLE_S, _fmt, _machine, fuzz_xargs, prompts
from load_tests.command_logs import command_logging
from patches.framework.switches import ALL, OFF_ENV
from serve_app.engine.engine_env import ENGINE_ENV

if TYPE_CHECKING:
    from testkit.engine_host import EngineHost

log = logging.getLogger("fuzzserve.benchmarks")

FIXTURE_LABEL = "fixture (hidden 128 x 2 layers)"  # the model named in results when --arch is not given

# engine -> (its environment, its engine arguments on top of ENGINE)
ENGINES: dict[str, tuple[dict[str, str], EngineKwargs]] = {
    "off": ({OFF_ENV: ALL}, {}),
    "on": ({}, {}),
    "on+offload": ({}, OFFLOAD),
    # every patch but cpu_inproc: the model in a worker process, as stock vLLM runs it on CPU
    "on-worker": ({OFF_ENV: "cpu_inproc"}, {}),
}
# engines that run only the unfuzzed workloads (their reference and their A/B)
UNFUZZED_ONLY = ("off", "on-worker")


def workloads(ps: list[str], out_tokens: int) -> dict[str, list[dict[str, Any]]]:
    """Per workload, one ``SamplingParams`` dict per prompt."""
    base: dict[str, Any] = {"temperature": 0.0, "ignore_eos": True}
    out = {}
    for name, n_out in (("decode", out_tokens), ("prefill", 1)):
        out[name] = [{**base, "max_tokens": n_out} for _ in ps]
        out[f"{name}+fuzz"] = [{**base, "max_tokens": n_out, "extra_args": fuzz_xargs(i)} for i in range(len(ps))]
        out[f"{name}+noise"] = [
            {
                **base,
                "max_tokens": n_out,
                "extra_args": {"fuzz_strength": NOISE_ONLY, "fuzz_mode": "gaussian", "fuzz_seed": i % 4},
            }
            for i in range(len(ps))
        ]
    return out


NOISE_ONLY = 1e-4  # noise of 1e-4 x the embedding's RMS: computed for every token, too small to change the text


def base_workload(w: str) -> str:
    return w.split("+")[0]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    command_logging()
    runs = _run(args)
    table = summarize(runs)
    meta = _meta(args, argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "patch_overhead.json").write_text(json.dumps({"meta": meta, "runs": runs, "table": table}, indent=2))
    (args.out / "patch_overhead.md").write_text(markdown(meta, table))
    log.info("wrote %s", args.out / "patch_overhead.md")
    return 0


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--omp-bind", default="0", help="VLLM_CPU_OMP_THREADS_BIND for every engine")
    ap.add_argument(
        "--host-cores",
        default="1" if len(os.sched_getaffinity(0)) > 1 else "",
        help="comma-separated cores for each engine's frontend and EngineCore ('' = not pinned)",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help="pause before each run: a stock engine keeps spinning for 1 s after its last step",
    )
    ap.add_argument(
        "--arch",
        default=None,
        metavar="HIDDENxLAYERS",
        help="run on an untrained model of this width and depth (fixture_model.sizing) instead of "
        "the fixture model: what the patches cost next to a model's compute (e.g. 1024x4)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    return ap.parse_args(argv)


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every engine up for the whole run, then the interleaved plan of (round, workload, engine): one record each."""
    from rich.progress import Progress

    from fixture_model.build import ensure_model
    from fixture_model.sizing import ensure_sizing_model, parse_arch
    from testkit.engine_host import EngineHost

    model = ensure_sizing_model(*parse_arch(args.arch)) if args.arch else ensure_model()
    names = list(workloads([], 0))
    kinds = list(dict.fromkeys(base_workload(w) for w in names))
    fresh = {
        (rnd, k): prompts(args.requests, args.prompt_tokens, "plain", seed=1000 * rnd + i + 1)
        for rnd in range(args.rounds)
        for i, k in enumerate(kinds)
    }
    warm = prompts(8, args.prompt_tokens, "plain", seed=0)
    env0 = {**ENGINE_ENV, "VLLM_CPU_OMP_THREADS_BIND": args.omp_bind}
    host_cores = [int(c) for c in args.host_cores.split(",")] if args.host_cores else None
    hosts: dict[str, EngineHost] = {}
    runs: list[dict[str, Any]] = []
    try:
        for name, (env, extra) in ENGINES.items():
            log.info("starting engine %s", name)
            engine_kwargs: EngineKwargs = {**ENGINE, **extra}  # disjoint keys (ENGINES' are on top of ENGINE's)
            hosts[name] = EngineHost(env={**env0, **env}, model=str(model), cpus=host_cores, **engine_kwargs)
            hosts[name].generate(warm, workloads(warm, args.output_tokens)["decode+fuzz"])  # warm-up
        plan = [
            (rnd, w, e)
            for rnd in range(args.rounds)
            for w in names
            for e in ENGINES
            if not (e in UNFUZZED_ONLY and "+" in w)
        ]
        unfuzzed_outputs: dict[tuple[int, str, str], list[list[int]]] = {}
        with Progress() as progress:
            task = progress.add_task("patch overhead", total=len(plan))
            for rnd, w, e in plan:
                run, texts = _measure(hosts[e], fresh[(rnd, base_workload(w))], w, args)
                run = {"round": rnd, "workload": w, "engine": e, **run}
                if "+" in w:  # the same prompts ran unfuzzed earlier this round on this engine
                    ref = unfuzzed_outputs[(rnd, base_workload(w), e)]
                    run["same_text_as_unfuzzed"] = sum(a == b for a, b in zip(texts, ref, strict=False)) / len(texts)
                else:
                    unfuzzed_outputs[(rnd, w, e)] = texts
                runs.append(run)
                progress.advance(task)
    finally:
        for h in hosts.values():
            h.close()
    return runs


def _measure(
    host: EngineHost, ps: list[str], w: str, args: argparse.Namespace
) -> tuple[dict[str, Any], list[list[int]]]:
    """One run of workload ``w`` on one engine: its rates and CPU per request, and each output's token ids."""
    time.sleep(args.settle_s)  # the previous run's engine stops spinning (see --settle-s)
    front0, engine0 = _tree_cpu(host.pid)
    t0 = time.perf_counter()
    outs = host.generate(ps, workloads(ps, args.output_tokens)[w])
    wall = time.perf_counter() - t0
    front1, engine1 = _tree_cpu(host.pid)
    cpu = front1 + engine1 - front0 - engine0
    tokens = sum(len(o["token_ids"]) for o in outs)
    texts = [o["token_ids"] for o in outs]
    run = {
        "wall_s": wall,
        "cpu_s": cpu,
        "req_per_s": len(outs) / wall,
        "tok_per_s": tokens / wall,
        "cpu_ms_per_req": 1000 * cpu / len(outs),
        "frontend_cpu_ms_per_req": 1000 * (front1 - front0) / len(outs),
        "engine_cpu_ms_per_req": 1000 * (engine1 - engine0) / len(outs),
        "distinct_tokens_per_req": statistics.mean(len(set(t)) for t in texts),
    }
    return run, texts


def _meta(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    return {
        "command": "python -m benchmarks.patch_overhead " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "model": f"untrained {args.arch} (fixture_model.sizing)" if args.arch else FIXTURE_LABEL,
        "workload": {
            "requests": args.requests,
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "rounds": args.rounds,
            "omp_bind": args.omp_bind,
            "settle_s": args.settle_s,
            "host_cores": args.host_cores,
        },
    }


def _tree_cpu(pid: int) -> tuple[float, float]:
    """User+system CPU seconds of (the engine host, i.e. ``LLM``'s frontend; its descendants: EngineCore, worker)."""
    import psutil

    root = psutil.Process(pid)
    totals = [0.0, 0.0]
    for i, p in enumerate([root, *root.children(recursive=True)]):
        try:
            t = p.cpu_times()
            totals[min(i, 1)] += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return totals[0], totals[1]


def ratio_stats(pairs: list[tuple[float, float]]) -> tuple[float | None, float | None, float | None]:
    """Median, min and max of ``a / b`` over the pairs whose ``b`` is positive; ``None`` if there are none.

    CPU times come from the OS in clock ticks (10 ms here), so a tiny run
    (the smoke test's 4 requests of 4 tokens) can measure 0 ms of engine CPU:
    that run has no ratio, rather than a division by zero.
    """
    xs = [a / b for a, b in pairs if b > 0]
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (workload, engine): median req/s and the median, min and max of run / same round's stock run.

    A fuzzed workload is compared with the stock engine's unfuzzed run of
    the same kind (stock vLLM cannot fuzz), and (``x unfuzzed``) with the
    same engine's unfuzzed run of the same round and prompts: what fuzzing
    costs on top of the patches being present. A ratio whose every
    denominator measured 0 is ``None`` (see ``ratio_stats``).
    """
    ref = {(r["round"], r["workload"]): r for r in runs if r["engine"] == "off"}
    same = {(r["round"], r["workload"], r["engine"]): r for r in runs if "+" not in r["workload"]}
    out = []
    for w in dict.fromkeys(r["workload"] for r in runs):
        for e in ENGINES:
            mine = [r for r in runs if r["workload"] == w and r["engine"] == e]
            if not mine:
                continue
            base = [ref[(r["round"], base_workload(w))] for r in mine]
            x_off, x_off_min, x_off_max = ratio_stats(
                [(r["req_per_s"], b["req_per_s"]) for r, b in zip(mine, base, strict=False)]
            )
            cpu_x, cpu_x_min, cpu_x_max = ratio_stats(
                [(r["cpu_ms_per_req"], b["cpu_ms_per_req"]) for r, b in zip(mine, base, strict=False)]
            )
            row: dict[str, Any] = {}
            if "+" in w:
                unf = [same[(r["round"], base_workload(w), e)] for r in mine]

                def x_unf(key: str, mine: list[dict[str, Any]] = mine, unf: list[dict[str, Any]] = unf) -> float | None:
                    return ratio_stats([(r[key], b[key]) for r, b in zip(mine, unf, strict=False)])[0]

                row = {
                    "x_unfuzzed": x_unf("req_per_s"),
                    "cpu_x_unfuzzed": x_unf("cpu_ms_per_req"),
                    "engine_cpu_x_unfuzzed": x_unf("engine_cpu_ms_per_req"),
                    "same_text_as_unfuzzed": statistics.median(r["same_text_as_unfuzzed"] for r in mine),
                }
            out.append(
                {
                    "workload": w,
                    "engine": e,
                    "runs": len(mine),
                    **row,
                    "req_per_s": statistics.median(r["req_per_s"] for r in mine),
                    "tok_per_s": statistics.median(r["tok_per_s"] for r in mine),
                    "x_off": x_off,
                    "x_off_min": x_off_min,
                    "x_off_max": x_off_max,
                    "cpu_ms_per_req": statistics.median(r["cpu_ms_per_req"] for r in mine),
                    "cpu_x_off": cpu_x,
                    "cpu_x_off_min": cpu_x_min,
                    "cpu_x_off_max": cpu_x_max,
                    "frontend_cpu_ms_per_req": statistics.median(r["frontend_cpu_ms_per_req"] for r in mine),
                    "engine_cpu_ms_per_req": statistics.median(r["engine_cpu_ms_per_req"] for r in mine),
                    "distinct_tokens_per_req": statistics.median(r["distinct_tokens_per_req"] for r in mine),
                }
            )
    return out


def markdown(meta: dict[str, Any], table: list[dict[str, Any]]) -> str:
    w = meta["workload"]
    lines = [
        "# Patch overhead inside the engine",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}. Model: {meta.get('model', FIXTURE_LABEL)}.",
        "",
        (
            f"Offline `LLM.generate`, {w['requests']} distinct prompts of {w['prompt_tokens']} tokens per run; "
            f"`decode`: {w['output_tokens']} tokens out (ignore_eos); `prefill`: 1 token out. "
            f"{w['rounds']} interleaved rounds, fresh prompts per round and workload, runs "
            f"{w.get('settle_s', 0)} s apart, "
            f"`VLLM_CPU_OMP_THREADS_BIND={w['omp_bind']}` for every engine's worker, its frontend and EngineCore "
            f"on cores `{w.get('host_cores') or 'any'}`; `x off` is the median (min-max) over rounds of run / the same "
            "round's stock run of the same unfuzzed workload. `CPU ms/req` is the CPU time of the engine's "
            "processes (frontend, EngineCore, worker) per request: less sensitive than wall time to where the "
            "scheduler puts processes on 2 shared cores; `x off` likewise."
        ),
        "",
        "| workload | engine | req/s | x off | min | max | CPU ms/req | x off | min | max |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['workload']} | {r['engine']} | {r['req_per_s']:.1f} | {_fmt(r['x_off'], digits=3)} | "
            f"{_fmt(r['x_off_min'], digits=3)} | {_fmt(r['x_off_max'], digits=3)} | "
            f"{r['cpu_ms_per_req']:.1f} | {_fmt(r['cpu_x_off'], digits=3)} | "
            f"{_fmt(r['cpu_x_off_min'], digits=3)} | {_fmt(r['cpu_x_off_max'], digits=3)} |"
        )
    lines += [
        "",
        "## Fuzzed runs against the same engine's unfuzzed run (same round, same prompts)",
        "",
        (
            "`x unfuzzed`: median over rounds of fuzzed run / unfuzzed run. CPU is split into the frontend "
            "(`LLM`'s process: tokenizing, detokenizing) and the engine (EngineCore and worker: scheduling, "
            "the model, the perturbation). `same text`: share of requests whose output tokens equal the "
            "unfuzzed run's. `distinct tokens`: distinct token ids per output (the fixture model's unfuzzed "
            "greedy text repeats itself)."
        ),
        "",
        (
            "| workload | engine | req/s x unfuzzed | CPU x unfuzzed | engine CPU x unfuzzed | frontend CPU ms/req "
            "| engine CPU ms/req | same text | distinct tokens |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    unf = {(r["workload"], r["engine"]): r for r in table if "+" not in r["workload"]}
    for r in table:
        if "+" not in r["workload"]:
            continue
        u = unf[(base_workload(r["workload"]), r["engine"])]
        lines.append(
            f"| {r['workload']} | {r['engine']} | {_fmt(r['x_unfuzzed'], digits=3)} | "
            f"{_fmt(r['cpu_x_unfuzzed'], digits=3)} | {_fmt(r['engine_cpu_x_unfuzzed'], digits=3)} | "
            f"{r['frontend_cpu_ms_per_req']:.2f} "
            f"(unfuzzed {u['frontend_cpu_ms_per_req']:.2f}) | {r['engine_cpu_ms_per_req']:.2f} "
            f"(unfuzzed {u['engine_cpu_ms_per_req']:.2f}) | {r['same_text_as_unfuzzed']:.0%} | "
            f"{r['distinct_tokens_per_req']:.1f} (unfuzzed {u['distinct_tokens_per_req']:.1f}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
