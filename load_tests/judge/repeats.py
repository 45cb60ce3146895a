"""``--repeat N``: the same profile run N times on one deployment, each figure as its median and spread.

Load figures on a shared 2-core host move by +-30 % from run to run, so a
single run's throughput or p99 is an anecdote; N runs give the median and the
spread (``(max - min) / median``) of each. The runs share the deployment
(its warm caches included) and each is judged on its own: the whole passes
only if every run passed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from ..results.models import Repeats, RunSummary, Spread

# The figures compared across runs: name -> how to read it from a run's summary (None where the run has none).
FIGURES: dict[str, Callable[[RunSummary], float | None]] = {
    "requests_per_s": lambda s: s.throughput.requests_per_s,
    "goodput_requests_per_s": lambda s: s.throughput.goodput_requests_per_s,
    "output_tokens_per_s": lambda s: s.throughput.output_tokens_per_s,
    "ttft_p50_s": lambda s: s.latency_s.ttft.p50,
    "ttft_p99_s": lambda s: s.latency_s.ttft.p99,
    "tpot_p50_s": lambda s: s.latency_s.tpot.p50,
    "tpot_p99_s": lambda s: s.latency_s.tpot.p99,
    "e2e_p50_s": lambda s: s.latency_s.e2e.p50,
    "e2e_p99_s": lambda s: s.latency_s.e2e.p99,
    "knee_concurrency": lambda s: None if s.capacity is None or s.capacity.knee is None else float(s.capacity.knee),
}


def spread(values: Sequence[float | None]) -> Spread:
    have = [v for v in values if v is not None]
    if not have:
        return Spread(values=list(values), median=None, min=None, max=None, relative_spread=None)
    med = statistics.median(have)
    return Spread(
        values=list(values),
        median=med,
        min=min(have),
        max=max(have),
        relative_spread=(max(have) - min(have)) / med if med else None,
    )


def repeats(summaries: Sequence[RunSummary], reports: Sequence[str]) -> Repeats:
    figures = {name: spread([read(s) for s in summaries]) for name, read in FIGURES.items()}
    return Repeats(
        runs=len(summaries),
        passed=sum(s.passed for s in summaries),
        figures={k: v for k, v in figures.items() if v.median is not None},
        reports=list(reports),
    )


def combined(summaries: Sequence[RunSummary], reports: Sequence[str]) -> RunSummary:
    """The last run's summary carrying every run's figures (``repeats``) and every run's failures, prefixed by
    the run they belong to."""
    out = summaries[-1].model_copy(deep=True)
    out.repeats = repeats(summaries, reports)
    out.failures = [f"run {i + 1}: {f}" for i, s in enumerate(summaries) for f in s.failures]
    return out
