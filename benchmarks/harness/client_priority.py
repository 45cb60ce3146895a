"""The benchmark client's CPU scheduling: real-time (``SCHED_FIFO``) so that no arm can starve it.

Why: on a host where the client shares the cores with the server it measures,
a server whose processes spin (plain vLLM's EngineCore and worker poll each
other on CPU, each always runnable) can keep the client off the CPU, and the
client then reads its own wait as the server's latency. Seen on the 2-core
host kind (results log, 2026-11-29 01:10-01:45 UTC): at 1 request in flight
the client's main thread waited in the run queue 0.35-0.85 s of every second
(``/proc/<tid>/schedstat``), raising plain vLLM's client-side TTFT mean to
57-158 ms while vLLM's own histograms put the first token 12-14 ms after
arrival (and the server's end-to-end mean equal to the client's: the
request was not slow, the client's read was). Nice -10 on the client did
not help (autogroups share the CPU between sessions before nice applies);
``SCHED_FIFO`` 1 did: 0 run-queue wait, client TTFT p50 17.4 ms, max 26.7.

What: :func:`apply` puts the calling thread (and the threads it starts
later) in ``SCHED_FIFO`` at the lowest real-time priority, where the kernel
lets it (``CAP_SYS_NICE``, or root); otherwise it leaves the thread as it is
and says so, and the caller records what the client ran with. A client on
``SCHED_FIFO`` preempts the server's threads whenever it has work, as a
client on another machine would never wait for them; its CPU time is still
the host's and still counted in every arm's host CPU per request. Linux's
real-time throttling (``sched_rt_runtime_us``, 95 % by default) keeps a
runaway client from locking up the host.

Every arm gets the same client, so the comparison stays fair; the
benchmark's ``--client-sched normal`` measures the old way.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("fuzzserve.benchmarks.client_priority")

ENV = "FUZZSERVE_BENCH_CLIENT_SCHED"  # what the benchmark asks of its client process: fifo | normal
FIFO, NORMAL = "fifo", "normal"
POLICIES = (FIFO, NORMAL)
FIFO_PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own


def apply_result(policy: str) -> str:
    """What :func:`apply` returns when ``policy`` took effect."""
    return f"SCHED_FIFO {FIFO_PRIORITY}" if policy == FIFO else NORMAL


def apply(policy: str) -> str:
    """Put the calling thread under ``policy``; return what it runs with (``"SCHED_FIFO 1"``, or why not)."""
    if policy not in POLICIES:
        raise ValueError(f"{ENV}={policy!r}: known values {', '.join(POLICIES)}")
    if policy == NORMAL:
        return apply_result(NORMAL)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
    except OSError as e:  # PermissionError without CAP_SYS_NICE
        log.warning("the benchmark client stays on normal scheduling: SCHED_FIFO refused (%s)", e)
        return f"normal (SCHED_FIFO refused: {e})"
    return apply_result(FIFO)


def fifo_allowed() -> str | None:
    """``None`` if this process may put a thread on ``SCHED_FIFO``, else why not (checked and undone here)."""
    before_policy, before_param = os.sched_getscheduler(0), os.sched_getparam(0)
    got = apply(FIFO)
    if got != apply_result(FIFO):
        return got
    os.sched_setscheduler(0, before_policy, before_param)
    return None


def choose(policy: str) -> tuple[str, str | None]:
    """The policy a benchmark can give its client: ``policy``, or normal with the reason ``fifo`` was refused."""
    refused = fifo_allowed() if policy == FIFO else None  # a refusal is logged where it happens (apply)
    return (NORMAL, refused) if refused else (policy, None)


def from_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Apply what :data:`ENV` asks (nothing when unset); return what the thread runs with."""
    return apply(environ.get(ENV, NORMAL))
