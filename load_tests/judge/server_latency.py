"""The server's own latency figures over a run: vLLM's TTFT, ITL and TPOT histograms, read per replica before and
after the load, their difference summed over the replicas, and percentiles read from it the way PromQL's
``histogram_quantile`` reads them.

Why the server's figures: on a small host the load generator shares the cores with the server, and under load its
event loop reads token chunks late and in bursts, so its ITL / TPOT measure the client (issue 47: a 0 ms ITL p50
over 214990 gaps). vLLM observes these histograms in each replica's frontend as the engine's outputs arrive, which
no client's lateness moves. Their price is resolution: a percentile is known to lie within one bucket, and is
interpolated linearly inside it; each figure here carries its bucket's bounds, so a reader sees how wide that is.
``serve_config.yaml`` sets finer buckets than vLLM's defaults (``custom_histogram_buckets``), whose inter-token
buckets start at 10 ms.

Written here rather than taken from a library: prometheus_client records histograms but reads no quantile from
them, and the rule is a dozen lines (Prometheus' ``promql/quantile.go``: the rank's bucket, linear inside it, the
``+Inf`` bucket answered with the highest finite bound).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ..observe.counters import HISTOGRAMS, ReplicaCounters
from ..results.models import ServerLatency, ServerPercentiles

QUANTILES = (50, 90, 95, 99)
SOURCE = (
    "vLLM's histograms in each replica's frontend (vllm:time_to_first_token_seconds, "
    "vllm:inter_token_latency_seconds, vllm:request_time_per_output_token_seconds), after minus before the load, "
    "summed over the replicas; percentiles interpolated inside their bucket as PromQL's histogram_quantile"
)


def window_buckets(
    final: Mapping[str, ReplicaCounters], baseline: Mapping[str, ReplicaCounters], figure: str
) -> dict[float, float]:
    """``figure``'s cumulative buckets over the window: each replica's final minus its baseline, summed.

    A replica first seen after the baseline counts from zero. A replica whose buckets went down (a replica id
    reused by a new process) counts from zero too: its final buckets are all it observed since."""
    out: dict[float, float] = {}
    for key, rc in final.items():
        now = rc.histograms.get(figure, {})
        before = baseline[key].histograms.get(figure, {}) if key in baseline else {}
        if any(now.get(le, 0.0) < v for le, v in before.items()):
            before = {}
        for le, v in now.items():
            out[le] = out.get(le, 0.0) + v - before.get(le, 0.0)
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> tuple[float, float, float] | None:
    """The ``q`` quantile (0..1) of cumulative ``buckets`` (upper bound -> count at or under it), with the bounds
    of the bucket it lies in: ``(value, lower, upper)``; None without observations.

    PromQL's rule: the rank ``q * total`` falls in the first bucket whose count reaches it; the value is linear
    between that bucket's lower bound (the previous bound, 0 for the first) and its upper bound; in the ``+Inf``
    bucket it is the highest finite bound (and the bucket reads ``(that bound, inf)``)."""
    if not buckets or not 0 <= q <= 1:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if math.isinf(bounds[-1]) else max(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower, lower, upper
            inside = count - below
            value = lower + (upper - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            return value, lower, upper
        lower, below = upper, count
    return lower, lower, math.inf


def percentiles(buckets: Mapping[float, float]) -> ServerPercentiles:
    """The :data:`QUANTILES` of ``buckets`` with their buckets' bounds, and how many observations they cover."""
    finite_or_inf = sorted(buckets)
    count = round(buckets[finite_or_inf[-1]]) if finite_or_inf else 0
    figures: dict[str, float | None] = {}
    bounds: dict[str, tuple[float, float]] = {}
    for p in QUANTILES:
        got = quantile(p / 100, buckets) if count else None
        figures[f"p{p}"] = got[0] if got else None
        if got:
            bounds[f"p{p}"] = (got[1], got[2])
    return ServerPercentiles(count=count, bucket_s=bounds, **figures)


def server_latency(
    final: Mapping[str, ReplicaCounters], baseline: Mapping[str, ReplicaCounters] | None
) -> ServerLatency:
    """TTFT, ITL and TPOT as the engines' frontends timed them over the window between ``baseline`` (the scrape
    before the load) and ``final`` (the scrape at quiescence)."""
    baseline = baseline or {}
    rows = {figure: percentiles(window_buckets(final, baseline, figure)) for figure in HISTOGRAMS.values()}
    return ServerLatency(source=SOURCE, **rows)
