"""How the closed loop's requests bunch: from ``vllm bench serve`` result files, the bunches in which requests start
and each one's TTFT by its place in its bunch.

    python -m benchmarks.investigations.arrival_bunches FILE.json [FILE.json ...] [--gap-ms 5]

Why: ``vs_vllm`` runs a closed loop (``--max-concurrency``, every request
sent at once, a fixed output length): a request starts when another one
ends, and requests that the engine prefilled in the same step decode in
lockstep, end in the same step, and so start their successors together.
A stack whose requests stay in bunches meets its first tokens in bunches:
the bunch's requests queue behind each other in the frontend and share a
prefill step, so the bunch's later members wait for the earlier ones. The
TTFT p50 at 8 in flight then depends on how large the bunches are, which
the report's means do not show. This reads them from the per-request
``start_times`` and ``ttfts`` that ``vllm bench serve --save-result
--save-detailed`` writes (``vs_vllm`` keeps them in its run directory,
``interleaved`` too: the directory its log names).

A bunch: requests whose starts follow each other within ``--gap-ms`` (5 ms
by default: a fraction of a decode step here, far below a request's
latency). Per file: the mean size of the bunch a request starts in (8
requests in one bunch read 8; evenly spread starts read 1), the share of
requests in bunches of 4 or more, the median TTFT by rank within the bunch
(0: the first to start), and the run's TTFT p50 as vLLM's client reported
it. Printed as Markdown; ``--json`` writes the same figures. A reading aid,
not a benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from load_tests.command_logs import command_logging

BIG = 4  # a bunch of at least this many requests counts as large
GAP_MS = 5.0  # starts closer than this to the previous one are one bunch (a fraction of a decode step here)


@dataclass(frozen=True)
class Bunches:
    """One client result file's bunches."""

    file: str
    requests: int
    mean_bunch: float  # the mean, over requests, of the size of the bunch each starts in
    share_in_large: float  # requests in bunches of BIG or more / requests
    ttft_ms_by_rank: dict[int, float]  # rank within the bunch -> median TTFT (ranks with 5 or more requests)
    ttft_p50_ms: float


def bunches(start_times: list[float], gap_s: float) -> list[list[int]]:
    """Request indices grouped into bunches: consecutive starts (in time order) within ``gap_s`` of each other."""
    order = sorted(range(len(start_times)), key=start_times.__getitem__)
    groups: list[list[int]] = []
    for prev, cur in zip([None, *order], order, strict=False):
        if prev is None or start_times[cur] - start_times[prev] > gap_s:
            groups.append([cur])
        else:
            groups[-1].append(cur)
    return groups


def read(path: Path, gap_s: float) -> Bunches:
    """The bunches of one ``vllm bench serve`` result (it must hold ``start_times`` and ``ttfts``)."""
    data = json.loads(path.read_text())
    starts, ttfts = data.get("start_times"), data.get("ttfts")
    if not starts or not ttfts or len(starts) != len(ttfts):
        raise ValueError(f"{path}: no per-request start_times and ttfts (vllm bench serve --save-detailed)")
    groups = bunches(starts, gap_s)
    by_rank: dict[int, list[float]] = {}
    for group in groups:
        for rank, i in enumerate(group):
            by_rank.setdefault(rank, []).append(ttfts[i] * 1000)
    n = len(starts)
    return Bunches(
        file=path.name,
        requests=n,
        mean_bunch=sum(len(g) ** 2 for g in groups) / n,
        share_in_large=sum(len(g) for g in groups if len(g) >= BIG) / n,
        ttft_ms_by_rank={r: statistics.median(v) for r, v in sorted(by_rank.items()) if len(v) >= 5},
        ttft_p50_ms=statistics.median(t * 1000 for t in ttfts),
    )


def markdown(rows: list[Bunches], gap_ms: float) -> str:
    ranks = sorted({r for row in rows for r in row.ttft_ms_by_rank})
    head = ["file", "requests", "mean bunch", f"in bunches of >= {BIG}", "TTFT p50 ms", *[f"rank {r}" for r in ranks]]
    lines = [
        (
            f"Bunches: starts within {gap_ms:g} ms of the previous one; rank r: the median TTFT (ms) of the "
            "bunches' (r+1)-th requests to start"
        ),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        by_rank = [f"{row.ttft_ms_by_rank[r]:.1f}" if r in row.ttft_ms_by_rank else "-" for r in ranks]
        cells = [row.file, str(row.requests), f"{row.mean_bunch:.2f}", f"{row.share_in_large:.2f}"]
        lines.append("| " + " | ".join([*cells, f"{row.ttft_p50_ms:.1f}", *by_rank]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.arrival_bunches",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="+", type=Path, help="vllm bench serve result files (--save-detailed)")
    ap.add_argument("--gap-ms", type=float, default=GAP_MS, help="starts closer than this are one bunch")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    command_logging()
    rows = [read(f, args.gap_ms / 1000) for f in args.files]
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(markdown(rows, args.gap_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
