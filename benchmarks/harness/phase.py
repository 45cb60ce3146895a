"""One phase of the headline benchmark: an arm warmed up, then every measured run of the workload against it.

Each run is vLLM's own client (``vllm bench serve``, through
:mod:`benchmarks.harness.vllm_bench_serve`) with vLLM's own arguments
(:func:`bench_argv`), in a process of its own on the scheduling the run asks
for, checked from its own word (:func:`run_client`: an arm whose threads spin
must not keep the client off the CPU and have its wait read as latency).
Around each run: the arm's own check (no Ray process beside plain vLLM), the
server's counters read until they have counted the run's requests, the host's
CPU over the client's measured window (:func:`summarize_run`) and the void
rule (:func:`benchmarks.harness.runs.void_reason`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Protocol

from benchmarks.harness import client_priority, cpu_accounting, vllm_bench_serve
from benchmarks.harness.arms import MODEL_NAME, ProtocolError, slug
from benchmarks.harness.host import HostCpuSampler
from benchmarks.harness.prompts import PromptSet
from benchmarks.harness.runs import Run, RunPercentiles, void_reason
from benchmarks.harness.server_counters import CacheCounters, wait_for_requests
from benchmarks.harness.workload import Workload, is_chat
from serve_app.engine.engine_env import ENGINE_ENV

log = logging.getLogger("fuzzserve.benchmarks.vs_vllm")  # the benchmark's logger: its console shows these lines

REPO = Path(__file__).resolve().parents[2]


class PhaseTarget(Protocol):
    """What a phase sends its runs to: a started arm (:mod:`benchmarks.harness.arms`), or one application of a
    shared cluster (:mod:`benchmarks.investigations.interleaved`)."""

    base_url: str
    metrics_urls: list[str]

    def check(self, when: str) -> None: ...


def bench_argv(base_url: str, tokenizer: Path, *args: Any, **kwargs: Any) -> list[str]:
    """The command of one measured run: ``vllm bench serve`` in a process of its own, with
    :func:`~benchmarks.harness.vllm_bench_serve.bench_flags` for the served model (``args`` and ``kwargs``: the rest
    of them, from ``concurrency`` on), each request's figures saved (the host CPU window is read from them)."""
    flags = vllm_bench_serve.bench_flags(base_url, MODEL_NAME, tokenizer, *args, detailed=True, **kwargs)
    return [sys.executable, "-m", "benchmarks.harness.vllm_bench_serve", *flags]


def run_client(
    argv: list[str], result: Path, sched: str = client_priority.NORMAL
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """Run the client under ``sched`` (:mod:`benchmarks.harness.client_priority`); return (its result JSON, CPU
    seconds per role and seconds per role its threads waited for a core, from its main run's start to its
    results). Raises if the client ran with other scheduling."""
    env = {**os.environ, **ENGINE_ENV, client_priority.ENV: sched}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    before = after = None  # (CPU, waits) snapshots at the main run's start and at its results
    ran_with = None
    tail: list[str] = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        tail = ([*tail, line])[-60:]
        if ran_with is None and vllm_bench_serve.SCHED_LINE in line:
            ran_with = line.split(vllm_bench_serve.SCHED_LINE, 1)[1].strip()
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


def _send(
    base_url: str,
    prompts: PromptSet,
    concurrency: int,
    label: str,
    workload: Workload,
    model: Path,
    work: Path,
    name: str,
    request_rate: float | None = None,
) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """``prompts`` sent by the client at ``concurrency`` in flight as run ``label`` would send them, its result
    saved as ``work / name``: :func:`run_client`'s (result, CPU per role, wait per role)."""
    dataset = prompts.write_jsonl(work / "prompts" / f"{prompts.name}.jsonl")
    argv = bench_argv(
        base_url,
        model,
        concurrency,
        dataset,
        len(prompts),
        workload.output_len,
        work,
        name,
        request_rate=request_rate,
        chat=is_chat(label),
    )
    return run_client(argv, work / name, workload.client_sched)


def _log_run(run: Run, counters: CacheCounters) -> None:
    log.info(
        "pair %d %s %s: %.1f req/s, TTFT p50 %.0f ms, %.1f host CPU ms/request (%d completed, %d failed); "
        "hits: %.0f local, %.0f offload%s",
        run.pair,
        run.stack,
        run.label,
        run.req_per_s,
        run.ttft_ms["p50"],
        1000 * run.host_cpu_s_per_request,
        run.completed,
        run.failed,
        counters.prefix_cache_hits,
        counters.external_hits,
        f"; VOID: {run.void}" if run.void else "",
    )


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
    warm = plan[pair, "warmup"]
    warmed = 0
    # the warm-up at each concurrency the runs use, in turn: a batch shape first met in a measured run (vLLM
    # compiles per shape on CPU) would be timed there
    for i, (label, c) in enumerate(workload.runs()):
        part = PromptSet(f"{warm.name}-{label}", warm.prompts[i :: len(workload.runs())], "unique")
        if not len(part):
            continue
        name = f"warmup-{pair}-{slug(stack)}-{attempt}-{label}.json"
        data, _, _ = _send(arm.base_url, part, c, label, workload, model, work, name)
        warmed += int(data["completed"])
    # the warm-up's requests must be counted before the first measured run's baseline
    settled = wait_for_requests(arm.metrics_urls, baseline or CacheCounters(), warmed)
    runs: list[Run] = []
    for label, c in workload.runs():
        prompts = plan[pair, label]
        arm.check(f"pair {pair} before the {label} run")
        name = f"{slug(stack)}-{pair}-{attempt}-{label}.json"
        data, roles, waited = _send(arm.base_url, prompts, c, label, workload, model, work, name, workload.request_rate)
        arm.check(f"pair {pair} after the {label} run")
        after = wait_for_requests(arm.metrics_urls, settled, int(data["completed"]))
        counters, settled = after - settled, after
        run = summarize_run(stack, pair, label, c, data, roles, sampler, waited)
        run.prompts, run.counters, run.attempt = prompts.describe(), counters.to_json(), attempt
        run.void = void_reason(workload.name, counters, run)
        runs.append(run)
        _log_run(run, counters)
    return runs
