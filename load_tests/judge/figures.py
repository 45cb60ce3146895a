"""A run's figures over its requests' results: percentiles (each with how many values it covers), the latency
rows, throughput and SLO goodput. Every latency figure of the load tests and the benchmarks comes from here."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..load.client import RequestResult
from ..load.client_cost import reads_late, tpot_reads_late
from ..plan.slo import Slo
from ..results.models import Latency, Percentiles, Throughput

PERCENTILES = (50, 90, 95, 99)


def percentiles(values: Sequence[float], points: Sequence[int] = PERCENTILES) -> dict[str, float | int | None]:
    """``{"p50": ..., ..., "mean": ..., "count": n}`` of ``values`` (None each when there are none): every latency
    figure of the load tests and the benchmarks, with how many values it covers."""
    out: dict[str, float | int | None] = {f"p{p}": None for p in points}
    out.update(mean=None, count=0)
    if len(values):
        arr = np.asarray(values, dtype=float)
        out.update({f"p{p}": float(np.percentile(arr, p)) for p in points})
        out.update(mean=float(arr.mean()), count=len(arr))
    return out


def latency(ok: Sequence[RequestResult], lag_p99_s: float | None = None) -> Latency:
    """The latency rows over the complete answers ``ok``, each over the requests that have the figure.

    ITL and TPOT are the client's only while it read token chunks on time: ITL with its loop's lag p99
    ``lag_p99_s`` over the bound, TPOT with that lag spread over a median stream's tokens over a tenth of it,
    either with chunks read in bursts: the row keeps its counts and carries the reason
    (:func:`~load_tests.load.client_cost.reads_late`, :func:`~load_tests.load.client_cost.tpot_reads_late`)
    instead of figures, never a 0 ms percentile."""

    def row(per_request: list[list[float]]) -> Percentiles:
        have = [xs for xs in per_request if xs]
        return Percentiles(**percentiles([x for xs in have for x in xs]), requests=len(have))

    itl = row([list(r.itl) if r.ttft is not None else [] for r in ok])
    tpot = row([[r.tpot] if r.tpot is not None else [] for r in ok])
    tokens = [float(r.output_tokens) for r in ok if r.tpot is not None]
    why_tpot = tpot_reads_late(lag_p99_s, itl.p50, tpot.p50, float(np.median(tokens)) if tokens else None)
    why_itl = reads_late(lag_p99_s, itl.p50)
    if why_itl is not None:
        itl = withheld(itl, why_itl)
    if why_tpot is not None:
        tpot = withheld(tpot, why_tpot)
    return Latency(
        ttft=row([[r.ttft] if r.ttft is not None else [] for r in ok]),
        itl=itl,
        tpot=tpot,
        e2e=row([[r.e2e] if r.e2e is not None else [] for r in ok]),
    )


def withheld(p: Percentiles, why: str) -> Percentiles:
    """``p`` with its figures removed and ``why`` said, its counts kept."""
    return Percentiles(count=p.count, requests=p.requests, p50=None, p90=None, p95=None, p99=None, mean=None, note=why)


def throughput(results: Sequence[RequestResult], wall_s: float, slo: Slo) -> Throughput:
    """Completed requests, output tokens and SLO goodput per second of ``wall_s`` (every request judged by
    :meth:`Slo.met`)."""
    ok = [r for r in results if r.outcome == "ok"]
    met = sum(slo.met(r) for r in ok)

    def rate(n: float) -> float:
        return n / wall_s if wall_s else 0.0

    return Throughput(
        completed=len(ok),
        requests_per_s=rate(len(ok)),
        output_tokens_per_s=rate(sum(r.output_tokens for r in ok)),
        slo_met=met,
        goodput_requests_per_s=rate(met),
    )
