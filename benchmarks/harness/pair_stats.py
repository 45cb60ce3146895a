"""The statistic every comparing benchmark uses, fixed before any data is seen.

Why pairs: on this shared 2-core VM the host's speed drifts by +-25 % within
minutes, more than most differences worth measuring. So the arms of a
comparison run in interleaved blocks ("pairs"), each block once in order and
the next in reverse (ABBA; with three arms ABC CBA), so that drift and
position bias cancel over an even number of blocks; each figure is compared
as the ratio of two arms *within* a block; and the result is the **median of
those ratios** with a **percentile-bootstrap 90 % interval** (10 000
resamples of the blocks, seeded), so that "within noise" is a statement with
numbers. Nothing here changes after a result has been seen:
:data:`MIN_PAIRS`, the interval and :func:`agreement` are the protocol.

With few pairs the bootstrap median can only be one of the observed ratios,
so the interval's ends are pair ratios; six pairs (the minimum a headline
run takes) give an interval that excludes the most extreme pair on each side.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Literal, TypedDict

BOOTSTRAP_SAMPLES = 10_000
MIN_PAIRS = 6  # a headline figure's pairs (an even number: every arm first as often as last)
CI_LEVEL = 0.90


def check_pairs(pairs: int, smoke: bool = False) -> None:
    """An even number of pairs, at least :data:`MIN_PAIRS` unless this is a smoke run (its figures say so)."""
    if pairs < 1 or pairs % 2:
        raise ValueError(f"--pairs {pairs}: an even number is needed (each arm runs first as often as last)")
    if pairs < MIN_PAIRS and not smoke:
        raise ValueError(
            f"--pairs {pairs}: the protocol takes at least {MIN_PAIRS} (or --smoke for a trial run "
            "whose figures are marked as below protocol)"
        )


def block_order(arms: Sequence[str], pairs: int) -> list[tuple[int, str]]:
    """(pair, arm) for every phase: the arms in order in even pairs, reversed in odd ones (ABC CBA ABC ...)."""
    order = []
    for p in range(pairs):
        order += [(p, a) for a in (arms if p % 2 == 0 else list(reversed(arms)))]
    return order


class PairRatio(TypedDict):
    """A figure compared pair by pair: how many pairs, each pair's ratio, their median and its 90 % interval."""

    pairs: int
    ratios: list[float]
    median: float
    ci90: list[float]


def median_ratio(
    pairs: Sequence[tuple[float, float]],
    samples: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
) -> PairRatio:
    """``pairs`` of (reference, candidate): the median of candidate / reference and its bootstrap 90 % interval."""
    ratios = [c / r for r, c in pairs]
    if not ratios:
        raise ValueError("no pairs to compare")
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(samples))
    lo = int((1 - CI_LEVEL) / 2 * samples)
    return {
        "pairs": len(ratios),
        "ratios": ratios,
        "median": statistics.median(ratios),
        "ci90": [boot[lo], boot[samples - lo - 1]],
    }


Verdict = Literal["agrees", "disagrees", "inconclusive"]


def agreement(ci90: Sequence[float], tolerance: float) -> Verdict:
    """``agrees`` only if the whole interval lies within 1 +- ``tolerance``; ``disagrees`` if it lies wholly
    outside; otherwise ``inconclusive`` (more pairs, or a quieter host, would be needed to say)."""
    lo, hi = ci90
    if 1 - tolerance <= lo and hi <= 1 + tolerance:
        return "agrees"
    if hi < 1 - tolerance or lo > 1 + tolerance:
        return "disagrees"
    return "inconclusive"


GoalVerdict = Literal["met", "not met"]
# A goal is met when the median ratio is on the goal's side and the whole interval within this factor of it.
GOAL_MARGIN = 0.95


def goal_verdict(
    median: float, ci90: Sequence[float], goal: float, higher_is_better: bool, margin: float = GOAL_MARGIN
) -> GoalVerdict:
    """``met`` only if the median ratio meets ``goal`` and the 90 % interval's far end stays within ``margin``
    of it: for a figure where higher is better (requests/s), median >= goal and lower end >= margin x goal;
    where lower is better (TTFT, CPU per request), median <= goal and upper end <= goal / margin. Anything
    else is ``not met``: a median alone on the right side, with an interval reaching past the margin, is not."""
    lo, hi = ci90
    if higher_is_better:
        return "met" if median >= goal and lo >= margin * goal else "not met"
    return "met" if median <= goal and hi <= goal / margin else "not met"
