"""The load generator's own cost while it runs: its process's CPU time and its event loop's lag.

On a host the client shares with the server (2 cores here), the client's CPU
is CPU the server did not get, so every report shows what the client took.
And the client times each token chunk when its event loop gets to read it:
a loop that runs late reads the chunks that arrived meanwhile in one pass,
microseconds apart, whatever the server's pace. Under that lag the gaps
between chunks (ITL) and the time per output token (TPOT) measure the
client, not the server: a 256-stream run read an ITL median of 6 us and a
TPOT p50 of 0 ms. :func:`reads_late` says when the client's ITL / TPOT are
withheld rather than reported (:func:`load_tests.judge.figures.latency`).

The lag is measured the way asyncio's own debug mode and aiomonitor do: a
task that sleeps a fixed interval and records how much later than asked it
woke (its own wake-up is one more task on the same loop, so it sees every
stretch the loop spent on other work).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

LAG_INTERVAL_S = 0.01  # how often the probe asks to wake
# The client's ITL / TPOT are withheld when its loop's lag p99 is over this: a token chunk may then be read this
# late, and vLLM's decode steps on the fixture model take 1-5 ms, so gaps measured under it are the client's.
LAG_BOUND_S = 0.005
# ... or when the median gap between token chunks is under this: no engine step is that short; chunks read in a
# burst (a late loop, or a server that sent them together) are.
BURST_ITL_S = 0.0001
# TPOT spreads a late read over a stream's tokens ((e2e - TTFT) / (tokens - 1)): it is withheld when the lag p99 so
# spread is over this share of the TPOT median, or when chunks came in bursts.
TPOT_LAG_SHARE = 0.1


class LoopLag:
    """Samples the running loop's lag until stopped (:meth:`start`, :meth:`stop`); ``lags`` in seconds."""

    def __init__(self, interval_s: float = LAG_INTERVAL_S):
        self.interval_s = interval_s
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def _sample(self) -> None:
        while True:
            asked = time.monotonic()
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, time.monotonic() - asked - self.interval_s))

    def start(self) -> None:
        self._task = asyncio.create_task(self._sample())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class ProcessCpu:
    """This process's CPU seconds (every thread: the load, the monitor's scrapes, the operator) between
    :meth:`start` and :meth:`stop`, and how long the calling thread (the event loop's) waited runnable for a
    CPU meanwhile (the kernel's ``/proc/thread-self/schedstat``: a client starved by the server's processes
    shows here, where its own CPU time stays small)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.wait0: float | None = None
        self.cpu_s = 0.0
        self.runqueue_wait_s: float | None = None

    def start(self) -> None:
        self.t0 = time.process_time()
        self.wait0 = runqueue_wait_s()

    def stop(self) -> float:
        if self.t0 is not None:
            self.cpu_s = time.process_time() - self.t0
        now = runqueue_wait_s()
        if self.wait0 is not None and now is not None:
            self.runqueue_wait_s = now - self.wait0
        return self.cpu_s


def runqueue_wait_s(path: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds the calling thread has waited runnable on a run queue (schedstat's second field, ns), or None
    where the kernel does not say."""
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def tpot_reads_late(
    lag_p99_s: float | None, itl_p50_s: float | None, tpot_p50_s: float | None, tokens_p50: float | None
) -> str | None:
    """Why the client's TPOT cannot be trusted, or None: chunks read in bursts, or its loop's lag p99 spread over
    a median stream's tokens over :data:`TPOT_LAG_SHARE` of the TPOT median."""
    if itl_p50_s is not None and itl_p50_s < BURST_ITL_S:
        return reads_late(None, itl_p50_s)
    if lag_p99_s is None or tpot_p50_s is None or not tokens_p50 or tokens_p50 < 2:
        return None
    spread = lag_p99_s / (tokens_p50 - 1)
    if spread > TPOT_LAG_SHARE * tpot_p50_s:
        return (
            f"withheld: the client's event loop ran {lag_p99_s * 1000:.1f} ms late (p99), "
            f"{spread * 1000:.2f} ms per token over a median stream, over {TPOT_LAG_SHARE:.0%} of the TPOT median"
        )
    return None


def reads_late(lag_p99_s: float | None, itl_p50_s: float | None) -> str | None:
    """Why the client's ITL / TPOT cannot be trusted, or None: its loop's lag p99 over :data:`LAG_BOUND_S`, or
    token chunks read in bursts (ITL median under :data:`BURST_ITL_S`)."""
    if lag_p99_s is not None and lag_p99_s > LAG_BOUND_S:
        return (
            f"withheld: the client's event loop ran {lag_p99_s * 1000:.1f} ms late (p99), over the "
            f"{LAG_BOUND_S * 1000:g} ms bound: it read token chunks late"
        )
    if itl_p50_s is not None and itl_p50_s < BURST_ITL_S:
        return (
            f"withheld: token chunks arrived in bursts (median gap {itl_p50_s * 1e6:.0f} us, under "
            f"{BURST_ITL_S * 1e6:g} us)"
        )
    return None


@dataclass
class ClientCostSample:
    """What a run measured of its client: CPU seconds over the load's window and the loop's lags (seconds)."""

    cpu_s: float
    lags: list[float] = field(default_factory=list)
    runqueue_wait_s: float | None = None  # the loop's thread, waiting for a CPU while runnable
