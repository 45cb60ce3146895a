"""A counter of the requests the guard admitted, by fuzz mode and strength.

Why it exists: operators want to know how much of a deployment's traffic is
fuzzed and how hard (a client that starts sending ``fuzz_strength: 1000``
changes what the replicas compute and what their caches hold), and nothing
else can say it: vLLM exports no per-request setting, and the fuzz patch runs
in the worker, where requests are batched. The guard has already parsed every
request's ``vllm_xargs``, so it counts there, once per admitted request,
before the engine sees it.

Exported through Ray Serve's metrics API (``ray.serve.metrics.Counter``), so
the series carry Serve's ``deployment``, ``replica`` and ``application`` tags
and Ray's metrics agent exports them as ``ray_fuzzserve_admitted_requests_total``
next to vLLM's counters. Labels are bounded: ``fuzz_mode`` is ``none`` (s = 0)
or one of the fuzz modes; ``fuzz_strength`` is the smallest decade bound that
is >= the strength (``0``, ``1e-04`` ... ``1e+03``), so a client sending
random strengths cannot blow up the series count.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from patches.definitions.fuzz_params import MAX_STRENGTH, FuzzSpec

if TYPE_CHECKING:  # for the annotation only: record() imports it at first use, inside the replica
    from ray.serve.metrics import Counter

METRIC = "fuzzserve_admitted_requests"
EXPORTED = f"ray_{METRIC}_total"
NEUTRAL_MODE = "none"
# Decade upper bounds of the strength label, from 1e-4 up to MAX_STRENGTH; smaller strengths count as 1e-4.
STRENGTH_BOUNDS = tuple(10.0**e for e in range(-4, round(math.log10(MAX_STRENGTH)) + 1))


def labels(spec: FuzzSpec) -> dict[str, str]:
    """The counter's labels for one request's fuzz settings."""
    if spec.is_neutral:
        return {"fuzz_mode": NEUTRAL_MODE, "fuzz_strength": "0"}
    bound = next(b for b in STRENGTH_BOUNDS if spec.strength <= b * (1 + 1e-9))
    return {"fuzz_mode": spec.mode, "fuzz_strength": f"{bound:.0e}"}


class FuzzTraffic:
    """Counts admitted requests; the Ray counter is created on first use, inside the replica."""

    def __init__(self) -> None:
        self._counter: Counter | None = None

    def record(self, spec: FuzzSpec) -> None:
        if self._counter is None:
            from ray.serve.metrics import Counter

            self._counter = Counter(
                METRIC,
                description="requests admitted by the fuzzserve guard, by fuzz mode and strength (decade upper bound)",
                # Ray annotates tag_keys as Tuple[str] (one key); ray.util.metrics.Metric takes Tuple[str, ...].
                tag_keys=("fuzz_mode", "fuzz_strength"),  # type: ignore[arg-type]
            )
        self._counter.inc(tags=labels(spec))
