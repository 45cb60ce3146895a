"""Keeping requests in flight: :func:`drive` as a :class:`~load_tests.plan.profiles.Profile` says, and
:func:`drive_levels` at a :class:`LoadLevel` that the autoscale steps change while the load runs.

Both call ``one(index)`` for indexes 0, 1, ... (``one`` sends the request and
records its outcome; it never raises) and return how many they started; a
``stop`` event ends the load early, still waiting for what is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable

from ..plan.profiles import Profile


async def drive(
    profile: Profile, one: Callable[[int], Awaitable[None]], seed: int = 0, stop: asyncio.Event | None = None
) -> int:
    """Call ``one(index)`` for indexes 0, 1, ... as the profile says; return how many were started.

    ``one`` must not raise (the caller records outcomes); ``stop`` ends the
    run early (Ctrl-C), still waiting for what is in flight.
    """
    if profile.kind == "sweep":
        raise ValueError("a sweep is a series of fixed-concurrency steps: load_tests.runner.sweep drives it")
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
        assert profile.rate is not None, "checked by Profile"
        rate = profile.rate
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
            next_at += rng.expovariate(rate)
            delay = next_at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
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


class LoadLevel:
    """The load's requests in flight, which autoscale steps change while it runs (:func:`drive_levels`)."""

    def __init__(self, concurrency: int):
        self.concurrency = concurrency
        self.changed = asyncio.Event()
        self.history: list[tuple[float, int]] = []  # (monotonic time, concurrency) of each change

    def set(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.history.append((time.monotonic(), concurrency))
        self.changed.set()


async def drive_levels(level: LoadLevel, one, stop: asyncio.Event) -> int:
    """Keep ``level.concurrency`` requests in flight (``one(index)`` each) until ``stop``; a lower level lets the
    surplus workers finish their request and end, a higher one starts more. How many were started."""
    started = 0
    workers: dict[int, asyncio.Task] = {}

    async def worker(w: int) -> None:
        nonlocal started
        while not stop.is_set() and w < level.concurrency:
            started += 1
            await one(started - 1)

    while not stop.is_set():
        for w in range(level.concurrency):
            if w not in workers or workers[w].done():
                workers[w] = asyncio.create_task(worker(w))
        level.changed.clear()
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(level.changed.wait())]
        await asyncio.wait(waiters, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        for f in waiters:
            f.cancel()
    await asyncio.gather(*workers.values())
    return started
