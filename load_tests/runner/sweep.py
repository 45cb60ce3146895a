"""The capacity search's driver (``--profile sweep``): steps of fixed concurrency inside one load run, each judged
as it ends (:mod:`load_tests.judge.capacity`), until one says stop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ..judge.capacity import capacity, step_figures, stop_reason
from ..load.drive import drive
from ..plan.profiles import Profile, SweepPlan
from ..plan.slo import Slo
from ..results.models import Capacity, SweepStep
from .loop import LoadLoop


class SweepDriver:
    """Drives the steps inside a load run (:func:`load_tests.runner.loop.run_load`'s ``driver``)."""

    def __init__(self, plan: SweepPlan, slo: Slo, seed: int = 0):
        self.plan, self.slo, self.seed = plan, slo, seed
        self.steps: list[SweepStep] = []
        self.stopped_because = "the sweep did not run"

    async def __call__(self, loop: LoadLoop, one: Callable[[int], Awaitable[None]], stop: asyncio.Event) -> int:
        started = 0
        self.stopped_because = f"the last step ({self.plan.top} in flight) ran"
        for c in self.plan.concurrencies():
            offset, seen = started, len(loop.checker.violations)
            t_start = time.monotonic() - loop.t0

            def step_one(i: int, offset: int = offset) -> Awaitable[None]:
                return one(offset + i)

            n = await drive(
                Profile(kind="fixed", concurrency=c, duration_s=self.plan.step_s), step_one, seed=self.seed, stop=stop
            )
            started += n
            wall = time.monotonic() - loop.t0 - t_start
            mine = [r for r in loop.results if offset <= r.index < offset + n]
            self.steps.append(
                step_figures(mine, n, c, t_start, wall, self.slo, loop.checker.violations[seen:], self.plan)
            )
            if stop.is_set():
                self.stopped_because = f"stopped by the user at {c} in flight"
                break
            if reason := stop_reason(self.steps, self.plan):
                self.stopped_because = reason
                break
        return started

    def result(self) -> Capacity:
        return capacity(self.steps, self.plan, self.stopped_because)
