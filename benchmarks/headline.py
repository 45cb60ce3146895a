"""README's headline table, written from a ``vs_vllm`` run's results rather than copied by hand.

    python -m benchmarks.headline docs/benchmarks/vs_vllm/vs_vllm.json

Why: README's "How fast" shows the done-when's run as one table (each goal's
median ratio, its 90 % interval and verdict; each arm's absolute req/s and
busy cores) and one line on the run (host, runs, void runs, failed requests,
cache hits). Copied by hand, 60 numbers can go wrong one at a time; written
from ``vs_vllm.json``, the table says what the run said, and a test holds the
generator to a run README showed. It reads the results only: it measures
nothing and judges nothing (the verdicts are ``vs_vllm``'s own, by
:func:`benchmarks.harness.pair_stats.goal_verdict`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# README's goal columns, in order: (goal as vs_vllm names it, column header)
GOAL_COLUMNS = (
    ("requests/s shipped / plain >= 1x", "req/s shipped / plain (>= 1.0x)"),
    ("host CPU per request shipped / plain <= 1x", "host CPU per request (<= 1.0x)"),
    ("TTFT p50 shipped / plain <= 1.1x", "TTFT p50 shipped / plain (<= 1.1x)"),
    ("TTFT p50 shipped / stock <= 1x", "TTFT p50 shipped / stock (<= 1.0x)"),
)
ARMS = ("plain", "stock", "engine", "shipped")


def row_name(label: str) -> str:
    """``c1`` -> "1 in flight", ``c8`` -> "8", ``chat8`` -> "chat, 8"."""
    if label.startswith("chat"):
        return f"chat, {label[4:]}"
    n = label[1:]
    return f"{n} in flight" if n == "1" else n


def goal_cell(goal: dict[str, Any] | None) -> str:
    if goal is None:
        return "-"
    lo, hi = goal["ci90"]
    verdict = goal["verdict"] if goal["verdict"] == "met" else f"**{goal['verdict']}**"
    return f"{goal['median']:.2f}x [{lo:.2f}, {hi:.2f}] {verdict}"


def arm_cell(arms: dict[str, dict[str, Any]], figure: str, fmt: str) -> str:
    values = [(arms.get(a) or {}).get(figure) for a in ARMS]
    return " / ".join("-" if v is None else format(v, fmt) for v in values)


def table(results: dict[str, Any]) -> str:
    """The headline table: one row per run label, in the run's order."""
    goals = {(g["run"], g["goal"]): g for g in results["goals"]}
    lines = [
        "| run | " + " | ".join(h for _, h in GOAL_COLUMNS) + " | req/s plain / stock / engine / shipped "
        "| busy cores, same order |",
        "|---" * (3 + len(GOAL_COLUMNS)) + "|",
    ]
    for label, arms in results["arms"].items():
        cells = [row_name(label), *(goal_cell(goals.get((label, g))) for g, _ in GOAL_COLUMNS)]
        cells += [arm_cell(arms, "req_per_s", ".1f"), arm_cell(arms, "host_busy_cores", ".2f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(results: dict[str, Any]) -> str:
    """One line on the run: host, sittings, runs, void runs, failed requests in **all** runs (a run with one is
    void, so over the counted runs the figure would be 0 by construction) and cache hits in the counted runs."""
    from benchmarks.harness.runs import Run, counted  # the benchmark's own rule for the runs that count

    meta, runs = results["meta"], [Run(**r) for r in results["runs"]]
    void = sum(1 for r in runs if r.void)
    valid = counted(runs)
    failed = sum(r.failed for r in runs)
    hits = sum(r.counters.get("hit_tokens", 0.0) for r in valid)
    sittings = meta.get("sittings") or [meta["date"]]
    return (
        f"host {meta['machine']}; started {sittings[0]}"
        + (f" in {len(sittings)} sittings" if len(sittings) > 1 else "")
        + f"; {meta['workload']['pairs']} pairs; {void} void runs of {len(runs)}, {failed} failed requests in all "
        f"runs, {hits:.0f} cache-hit tokens in the counted runs"
        + (f"; **below protocol**: {meta['below_protocol']}" if meta.get("below_protocol") else "")
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.headline", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a vs_vllm.json")
    args = ap.parse_args(argv)
    results = json.loads(args.results.read_text())
    sys.stdout.write(summary(results) + "\n\n" + table(results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
