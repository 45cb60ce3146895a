"""The headline benchmark's record of a run, and its rule for the runs that count.

A :class:`Run` is one ``vllm bench serve`` run against one phase (an arm in
one pair), as ``vs_vllm.json`` keeps it; :class:`Meta` is that file's
``meta``. Here too is what decides whether a run counts, fixed before the
data and the same for every arm: :func:`void_reason` (a failed request, a
stall, a reference that stalled outside its engine, a cold run with cache
hits) and :func:`counted` (the latest valid run of each pair, arm and label).
Whoever reads the results (the comparison, :mod:`benchmarks.harness.comparison`;
:mod:`benchmarks.headline`) takes the runs that count from here, so that no
reader has a rule of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from benchmarks.harness.arms import parse_arm
from benchmarks.harness.cpu_accounting import CLIENT_ROLE
from benchmarks.harness.server_counters import CacheCounters, CountersJson

# A run is a stall (void, whatever its arm) when its TTFT p99 is over this many times its p50.
STALL_P99_OVER_P50 = 10.0
# A reference's run (plain, stock) stalled outside its engine when the client's mean TTFT is over this many times
# the server's own (vllm:time_to_first_token_seconds over the same run) and longer by at least STALL_OUTSIDE_MS:
# the request waited in a starved frontend, not in the engine (healthy plain: 3.7 ms of 12 ms outside).
STALL_OUTSIDE_X = 3.0
STALL_OUTSIDE_MS = 20.0
REFERENCE_ARMS = ("plain", "stock")
# Beside the figures: the benchmark client's CPU per request (cpu_accounting.CLIENT_ROLE), fixed work whatever the
# arm (the same prompts, every token streamed), so its pair ratio marks the host's speed in the two phases. The
# host ran 1.3-1.5x slower for minutes at a time on this machine kind, every process alike (docs/results_log.md,
# 2026-11-29 04:34); a ratio far from 1 says the pair's arms met different speeds. Reported, never judged.
SPEED_MARKER = "client_cpu_per_request"


class RunPercentiles(TypedDict):
    """One latency figure of a run, in ms, as vLLM's bench reports it (None where its result lacks it); ``mean``
    only where the client's result was read (:func:`benchmarks.harness.phase.summarize_run`)."""

    p50: float | None
    p99: float | None
    mean: NotRequired[float | None]


@dataclass
class Run:
    """One ``vllm bench serve`` run against one phase."""

    stack: str  # the arm
    pair: int
    label: str
    concurrency: int
    completed: int
    failed: int
    duration_s: float
    req_per_s: float
    output_tok_per_s: float
    ttft_ms: RunPercentiles
    tpot_ms: RunPercentiles
    itl_ms: RunPercentiles
    e2el_ms: RunPercentiles
    window_s: float
    host_cpu_s: float
    host_cpu_s_per_request: float
    host_busy_cores: float
    prompts: dict[str, int | str] = field(default_factory=dict)  # the prompt set's description
    counters: CountersJson = field(default_factory=CountersJson)  # the server's counters over the run
    void: str | None = None  # why the run counts nowhere
    attempt: int = 0  # 0, or which re-run of its phase (a phase with a void run is run again)
    roles_ms_per_request: dict[str, float] = field(default_factory=dict)
    # ms per request the role's threads waited for a core (runnable, not running; schedstat), over the client's
    # main run; empty in runs recorded before it was read
    roles_wait_ms_per_request: dict[str, float] = field(default_factory=dict)
    # CPU seconds per second the hypervisor took from the host over the window (/proc/stat's steal; not inside
    # host_cpu_s): reported beside the figures, never judged; None in runs recorded before it was read
    host_steal_cores: float | None = None

    def figure(self, name: str) -> float:
        if name == SPEED_MARKER:  # ms; 0.0 where the run recorded no client process
            return self.roles_ms_per_request.get(CLIENT_ROLE, 0.0)
        if name in ("ttft_p50", "ttft_p99", "tpot_p50", "e2el_p50"):
            metric, pct = name.rsplit("_", 1)
            return getattr(self, f"{metric}_ms")[pct]
        return getattr(self, name)


class Meta(TypedDict):
    """``vs_vllm.json``'s ``meta``: the command, when and where, the workload (the fields of
    :class:`~benchmarks.harness.workload.Workload` and the run's settings), the protocol checks as they passed, each
    phase's engine replicas, and why the run is below protocol (None: it is not)."""

    command: str
    date: str
    machine: str
    workload: dict[str, Any]
    protocol: list[str]
    replicas: dict[str, int]
    below_protocol: str | None
    # the git tree of what the run measures (benchmarks.harness.resume.code_version; None: not vouched for), and
    # when each sitting of a resumed run started (absent in runs recorded before either was kept)
    code: NotRequired[str | None]
    sittings: NotRequired[list[str]]


def void_reason(workload: str, counters: CacheCounters, run: Run | None = None) -> str | None:
    """Why a run cannot count: any failed request, a stall (TTFT p99 over :data:`STALL_P99_OVER_P50` x p50),
    or a cold run that the server served any prompt token of from a cache."""
    if run is not None and run.failed:
        return f"{run.failed} failed request(s)"
    if run is not None:
        p50, p99 = run.ttft_ms["p50"], run.ttft_ms["p99"]
        if p50 is None or p99 is None:
            raise ValueError(f"pair {run.pair} {run.stack} {run.label}: the client's result has no TTFT p50 or p99")
        if p99 > STALL_P99_OVER_P50 * p50:
            return f"stalled: TTFT p99 {p99:.0f} ms is over {STALL_P99_OVER_P50:g}x its p50 ({p50:.0f} ms)"
    server = (run.counters.get("latency_mean_ms") or {}).get("server_ttft") if run is not None else None
    client = run.ttft_ms.get("mean") if run is not None else None
    if (
        run is not None
        and parse_arm(run.stack)[0] in REFERENCE_ARMS
        and server
        and client is not None
        and client > STALL_OUTSIDE_X * server
        and client - server > STALL_OUTSIDE_MS
    ):
        return (
            f"stalled outside the engine: client TTFT mean {client:.0f} ms, the server's own {server:.0f} ms "
            f"(its frontend or the client starved)"
        )
    if workload == "cold" and counters.hit_tokens > 0:
        return (
            f"cold run with cache hits: {counters.prefix_cache_hits:.0f} prompt tokens from the prefix cache, "
            f"{counters.external_hits:.0f} from the offload tier"
        )
    return None


def counted(runs: list[Run]) -> list[Run]:
    """The runs that count: not void, and one per pair, arm and run label (a phase run again after a void run
    measures every label again; its latest valid run of each counts, as in the pair ratios)."""
    return list({(r.pair, r.stack, r.label): r for r in runs if r.void is None}.values())


def missing_runs(runs: list[Run], arms: list[str], pairs: int, labels: list[str]) -> list[str]:
    """Every (pair, arm, run label) with no valid (non-void) run."""
    valid = {(r.pair, r.stack, r.label) for r in counted(runs)}
    return [f"pair {p} {a} {lab}" for p in range(pairs) for a in arms for lab in labels if (p, a, lab) not in valid]
