"""The headline benchmark's figures from its runs: pair ratios of two arms, the goals' verdicts, each arm's own.

Every figure here is computed over the runs that count
(:func:`benchmarks.harness.runs.counted`) with the statistic fixed before the
data (:mod:`benchmarks.harness.pair_stats`): per run label, the ratio of two
arms within each pair, the median of those ratios and its bootstrap 90 %
interval (:func:`compare`); each goal of :data:`GOALS` met or not met by
:func:`benchmarks.harness.pair_stats.goal_verdict` (:func:`goals`). Beside
them, reported and never judged: each arm's own medians (:func:`arm_figures`,
absolute, so that hosts compare), the prompt tokens each cache tier served
(:func:`hits_by_arm`) and where the time to first token went
(:func:`ttft_split`). ``vs_vllm.json`` keeps all of them
(:func:`benchmarks.harness.report.write_results`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Literal, TypedDict

from benchmarks.harness import pair_stats
from benchmarks.harness.runs import SPEED_MARKER, Run, counted

REFERENCE = "plain"
# Figures compared as ratios (candidate / reference) pair by pair; Run attribute or (attribute, percentile).
FIGURES = {
    "req_per_s": "requests/s",
    "host_cpu_s_per_request": "host CPU per request",
    "ttft_p50": "TTFT p50",
    "ttft_p99": "TTFT p99",
    "tpot_p50": "TPOT p50",
    "e2el_p50": "latency p50",
}
SPEED_MARKER_TITLE = "client CPU per request (host speed)"  # SPEED_MARKER in the tables


@dataclass(frozen=True)
class Goal:
    """One goal of the headline: ``candidate / reference`` of ``figure`` at most (or at least) ``ratio``."""

    candidate: str
    reference: str
    figure: str
    ratio: float
    higher_is_better: bool

    def text(self) -> str:
        return (
            f"{FIGURES[self.figure]} {self.candidate} / {self.reference} "
            f"{'>=' if self.higher_is_better else '<='} {self.ratio:g}x"
        )


# Issue 45's goals, for every run label (completions and chat): the first token no slower than plain's by more
# than 10 % nor than the stock peer's, as many requests/s as plain, no more host CPU per request.
GOALS = (
    Goal("shipped", "plain", "ttft_p50", 1.1, False),
    Goal("shipped", "stock", "ttft_p50", 1.0, False),
    Goal("shipped", "plain", "req_per_s", 1.0, True),
    Goal("shipped", "plain", "host_cpu_s_per_request", 1.0, False),
)


class Comparison(TypedDict):
    """Two arms at one run label, over the pairs where both have a valid run: each figure's pair ratios
    (candidate / reference), the host-speed marker's, and the requests completed and failed by each arm over those
    pairs."""

    candidate: str
    reference: str
    figures: dict[str, pair_stats.PairRatio]
    speed_marker: pair_stats.PairRatio | None  # SPEED_MARKER's ratio: did the pair's arms meet the same host speed
    requests: dict[str, int]
    failed: dict[str, int]


def speed_marker(pairs: list[tuple[Run, Run]]) -> pair_stats.PairRatio | None:
    """:data:`SPEED_MARKER` candidate / reference over ``pairs`` of (reference, candidate) runs; None where a run
    recorded no client CPU."""
    values = [(r.figure(SPEED_MARKER), c.figure(SPEED_MARKER)) for r, c in pairs]
    if not values or any(v <= 0 for pair in values for v in pair):
        return None
    return pair_stats.median_ratio(values)


def compare(runs: list[Run], reference: str = REFERENCE) -> dict[str, dict[str, Comparison]]:
    """Per run label and arm pair (candidate vs reference): each figure's median pair ratio and interval.

    Arm pairs: every arm against ``reference``, ``shipped`` against ``engine`` (what the Serve path costs) and
    against ``stock`` (the peer). Void runs count nowhere."""
    out: dict[str, dict[str, Comparison]] = {}
    arms = list(dict.fromkeys(r.stack for r in runs))
    comparisons = [(a, reference) for a in arms if a != reference and reference in arms]
    if reference not in arms and arms:  # a lever's A/B (e.g. shipped against shipped+VAR=1): against the first arm
        comparisons = [(a, arms[0]) for a in arms[1:]]
    for ref in ("engine", "stock"):
        if "shipped" in arms and ref in arms:
            comparisons.append(("shipped", ref))
    for label in dict.fromkeys(r.label for r in runs):
        by = {(r.pair, r.stack): r for r in counted(runs) if r.label == label}
        out[label] = {}
        for cand, ref in comparisons:
            pairs = sorted({p for p, _ in by if (p, cand) in by and (p, ref) in by})
            if not pairs:
                continue
            out[label][f"{cand}/{ref}"] = {
                "candidate": cand,
                "reference": ref,
                "figures": {
                    f: pair_stats.median_ratio([(by[p, ref].figure(f), by[p, cand].figure(f)) for p in pairs])
                    for f in FIGURES
                },
                "speed_marker": speed_marker([(by[p, ref], by[p, cand]) for p in pairs]),
                "requests": {s: sum(by[p, s].completed for p in pairs) for s in (ref, cand)},
                "failed": {s: sum(by[p, s].failed for p in pairs) for s in (ref, cand)},
            }
    return out


HitKey = Literal["requests", "prompt_tokens", "prefix_cache_hits", "external_hits"]
HIT_KEYS: tuple[HitKey, ...] = ("requests", "prompt_tokens", "prefix_cache_hits", "external_hits")


def hits_by_arm(runs: list[Run]) -> dict[str, dict[str, dict[HitKey, float]]]:
    """Per run label and arm: requests and prompt tokens served by each tier, summed over the arm's runs."""
    out: dict[str, dict[str, dict[HitKey, float]]] = {}
    for r in runs:
        c = r.counters
        slot = out.setdefault(r.label, {}).setdefault(r.stack, dict.fromkeys(HIT_KEYS, 0.0))
        for k in HIT_KEYS:
            slot[k] += c.get(k, 0.0) or 0.0
    return out


SplitPart = Literal["client", "server", "queue", "prefill", "outside", "handoffs"]
SPLIT_PARTS: tuple[SplitPart, ...] = ("client", "server", "queue", "prefill", "outside", "handoffs")


def ttft_split(runs: list[Run]) -> dict[str, dict[str, dict[SplitPart, float | None]]]:
    """Per run label and arm: where the time to first token went, in ms, each part the median over the arm's
    (non-void) runs of that run's mean.

    ``client``: vLLM's bench (request sent until first token received); ``server``: the server's own
    ``vllm:time_to_first_token_seconds`` (arrival at ``AsyncLLM`` until the frontend has the token); ``queue``
    and ``prefill``: EngineCore's (:mod:`benchmarks.harness.server_counters`). Derived: ``outside`` = client - server
    (HTTP, parsing, the guard; HAProxy and Ray's streaming on the shipped stack) and ``handoffs`` = server -
    queue - prefill (frontend to EngineCore and back). A part a server does not time is None."""
    out: dict[str, dict[str, dict[SplitPart, float | None]]] = {}
    for label in dict.fromkeys(r.label for r in runs):
        for arm in dict.fromkeys(r.stack for r in runs):
            mine = [r for r in counted(runs) if r.label == label and r.stack == arm]
            if not mine:
                continue
            per_run: list[dict[SplitPart, float | None]] = []
            for r in mine:
                means = r.counters.get("latency_mean_ms") or {}
                client, server = r.ttft_ms.get("mean"), means.get("server_ttft")
                queue, prefill = means.get("queue"), means.get("prefill")
                per_run.append(
                    {
                        "client": client,
                        "server": server,
                        "queue": queue,
                        "prefill": prefill,
                        "outside": client - server if client is not None and server is not None else None,
                        "handoffs": (
                            server - queue - prefill
                            if server is not None and queue is not None and prefill is not None
                            else None
                        ),
                    }
                )
            out.setdefault(label, {})[arm] = {
                k: (statistics.median(vals) if (vals := [v for row in per_run if (v := row[k]) is not None]) else None)
                for k in SPLIT_PARTS
            }
    return out


class GoalRow(TypedDict):
    """One goal (:class:`Goal`, its fields in order) at one run label: the ratio, its interval and the verdict."""

    run: str
    goal: str
    candidate: str
    reference: str
    figure: str
    ratio: float
    higher_is_better: bool
    median: float
    ci90: list[float]
    pairs: int
    verdict: pair_stats.GoalVerdict


def goals(ratios: dict[str, dict[str, Comparison]]) -> list[GoalRow]:
    """Every goal of :data:`GOALS` at every run label where both its arms ran: the ratio, its interval, and
    ``met`` / ``not met`` (:func:`benchmarks.harness.pair_stats.goal_verdict`)."""
    out: list[GoalRow] = []
    for label, comps in ratios.items():
        for g in GOALS:
            comp = comps.get(f"{g.candidate}/{g.reference}")
            if comp is None:
                continue
            fig = comp["figures"][g.figure]
            out.append(
                {
                    "run": label,
                    "goal": g.text(),
                    "candidate": g.candidate,
                    "reference": g.reference,
                    "figure": g.figure,
                    "ratio": g.ratio,
                    "higher_is_better": g.higher_is_better,
                    "median": fig["median"],
                    "ci90": fig["ci90"],
                    "pairs": fig["pairs"],
                    "verdict": pair_stats.goal_verdict(fig["median"], fig["ci90"], g.ratio, g.higher_is_better),
                }
            )
    return out


ARM_FIGURES = ("req_per_s", "ttft_p50", "ttft_p99", "e2el_p50", "host_cpu_s_per_request", "host_busy_cores")


class ArmFigures(TypedDict):
    """One arm at one run label: each of :data:`ARM_FIGURES`' median over its counted runs (None: no valid run),
    how many runs counted and how many were void."""

    req_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    e2el_p50: float | None
    host_cpu_s_per_request: float | None
    host_busy_cores: float | None
    runs: int
    void: int


def arm_figures(runs: list[Run]) -> dict[str, dict[str, ArmFigures]]:
    """Per run label and arm, each figure's median over the arm's counted runs (:func:`counted`; absolute, so
    hosts compare), and how many of its runs were void."""
    out: dict[str, dict[str, ArmFigures]] = {}
    for label in dict.fromkeys(r.label for r in runs):
        for arm in dict.fromkeys(r.stack for r in runs):
            void = sum(1 for r in runs if r.label == label and r.stack == arm and r.void is not None)
            valid = [r for r in counted(runs) if r.label == label and r.stack == arm]
            if not valid and not void:
                continue
            med = {f: (statistics.median(r.figure(f) for r in valid) if valid else None) for f in ARM_FIGURES}
            out.setdefault(label, {})[arm] = {
                "req_per_s": med["req_per_s"],
                "ttft_p50": med["ttft_p50"],
                "ttft_p99": med["ttft_p99"],
                "e2el_p50": med["e2el_p50"],
                "host_cpu_s_per_request": med["host_cpu_s_per_request"],
                "host_busy_cores": med["host_busy_cores"],
                "runs": len(valid),
                "void": void,
            }
    return out
