"""Load profiles: when the generator starts each request.

``fixed``
    ``concurrency`` requests in flight at all times (closed loop).
``ramp``
    closed loop whose concurrency grows linearly from 1 to ``concurrency``
    over ``ramp_s`` seconds, then holds.
``poisson``
    open loop: requests arrive at ``rate`` per second with exponential gaps,
    whatever the server does (``concurrency`` caps what is in flight, so a
    stalled server cannot make the generator exhaust memory).
``sweep``
    the capacity search (:mod:`load_tests.sweep`): closed-loop steps of
    ``step_s`` seconds at 1, 2, 4, ... requests in flight up to
    ``concurrency``, stopping early once the SLO goodput stops rising or a
    step breaks an invariant or the error budget.

A run stops starting requests when ``duration_s`` has passed or
``max_requests`` have started, whichever comes first (at least one must be
set, except for a sweep, whose steps are bounded by ``step_s``), then waits
for every request in flight: nothing started is abandoned.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["fixed", "ramp", "poisson", "sweep"] = "fixed"
    concurrency: int = Field(16, ge=1, description="in flight (fixed/ramp: target; poisson: cap; sweep: the last "
                                                   "step's)")
    rate: float | None = Field(None, gt=0, description="poisson: requests per second")
    ramp_s: float = Field(30.0, ge=0, description="ramp: seconds to reach full concurrency")
    duration_s: float | None = Field(None, gt=0)
    max_requests: int | None = Field(None, ge=1)
    step_s: float = Field(30.0, gt=0, description="sweep: seconds of load per step (duration_s and max_requests "
                                                  "do not apply to a sweep)")

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.kind != "sweep" and self.duration_s is None and self.max_requests is None:
            raise ValueError("set duration_s or max_requests (or both): a run must stop by itself")
        if self.kind == "poisson" and self.rate is None:
            raise ValueError("the poisson profile needs rate (requests per second)")
        return self


async def drive(profile: Profile, one: Callable[[int], Awaitable[None]], seed: int = 0,
                stop: asyncio.Event | None = None) -> int:
    """Call ``one(index)`` for indexes 0, 1, ... as the profile says; return how many were started.

    ``one`` must not raise (the caller records outcomes); ``stop`` ends the
    run early (Ctrl-C), still waiting for what is in flight.
    """
    if profile.kind == "sweep":
        raise ValueError("a sweep is a series of fixed-concurrency steps: load_tests.sweep drives it")
    stop = stop or asyncio.Event()
    t0 = time.monotonic()
    started = 0

    def more() -> bool:
        if stop.is_set():
            return False
        if profile.max_requests is not None and started >= profile.max_requests:
            return False
        return profile.duration_s is None or time.monotonic() - t0 < profile.duration_s

    def take() -> int | None:
        nonlocal started
        if not more():
            return None
        started += 1
        return started - 1

    if profile.kind == "poisson":
        rng = random.Random(seed)
        sem = asyncio.Semaphore(profile.concurrency)
        tasks: set[asyncio.Task] = set()

        async def guarded(i: int) -> None:
            try:
                await one(i)
            finally:
                sem.release()

        next_at = time.monotonic()
        while True:
            next_at += rng.expovariate(profile.rate)
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
            await sem.acquire()
            i = take()
            if i is None:
                sem.release()
                break
            t = asyncio.create_task(guarded(i))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
        return started

    async def worker(w: int) -> None:
        if profile.kind == "ramp" and profile.concurrency > 1:
            await asyncio.sleep(profile.ramp_s * w / (profile.concurrency - 1))
        while (i := take()) is not None:
            await one(i)

    await asyncio.gather(*(worker(w) for w in range(profile.concurrency)))
    return started


class SweepPlan(BaseModel):
    """How the capacity search steps and what it calls the knee."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top: int = Field(256, ge=1, description="the last step's requests in flight")
    start: int = Field(1, ge=1, description="the first step's")
    factor: float = Field(2.0, gt=1, description="each step's concurrency over the one before")
    step_s: float = Field(30.0, gt=0, description="seconds of load per step")
    slo_attainment: float = Field(0.95, gt=0, le=1, description="share of a step's complete answers that must meet "
                                                                "the SLO for the step to meet it")
    error_budget: float = Field(0.01, ge=0, le=1, description="unexpected failures allowed, as a share of a step's "
                                                              "requests")
    knee_within: float = Field(0.05, ge=0, lt=1, description="the knee's goodput is within this of the best; a step "
                                                             "must beat the best by more to count as rising")
    patience: int = Field(2, ge=1, description="steps in a row without a rise that end the sweep")

    @classmethod
    def from_profile(cls, profile: Profile, **kw) -> SweepPlan:
        return cls(top=profile.concurrency, step_s=profile.step_s, **kw)

    def concurrencies(self) -> list[int]:
        """``start``, ``start x factor``, ... (rounded, each larger than the last), ending at ``top``."""
        out, c = [], float(self.start)
        while round(c) < self.top:
            if not out or round(c) > out[-1]:
                out.append(round(c))
            c *= self.factor
        return out + [self.top]
