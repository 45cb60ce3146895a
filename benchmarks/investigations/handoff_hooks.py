r"""Per-request timestamps of the hand-offs between vLLM's frontend and EngineCore, in a benchmark's server.

A vLLM general plugin (vLLM loads every ``vllm.general_plugins`` entry point
in each of its processes), present only where a benchmark puts
:data:`PLUGIN_DIR` on ``PYTHONPATH``: that folder holds nothing but the
entry point's metadata, which names :func:`install_from_env`. With
:data:`TRACE_ENV` set to a file, it installs two read-only wrappers in the
process's vLLM frontend, which append one JSON line per request when its
first token reaches the frontend, and one per EngineCore step output:

* ``AsyncMPClient.add_request_async``: when the frontend hands the request
  to its ZMQ socket (``sent``, monotonic);
* ``OutputProcessor.process_outputs``: the EngineCore timestamps vLLM
  already carries to the frontend (``queued``, ``scheduled``: the
  scheduler's events; ``core_out``: when EngineCore built the step's
  outputs, all monotonic) and when the frontend began and ended processing
  that output (``got``, ``done``), beside the request's ``arrival`` (vLLM's
  wall-clock arrival, converted to monotonic here) and the TTFT vLLM itself
  records (``ttft``).

The same plugin serves vLLM's own OpenAI server and a Ray Serve replica
(whose frontend is the same ``AsyncLLM``): a process that has no frontend
(EngineCore) opens the file and never writes to it. Every clock here is the
host's CLOCK_MONOTONIC (``time.monotonic``), one clock for every process of
the host, so EngineCore's timestamps and the frontend's subtract directly.
Only the ``arrival`` is wall-clock in vLLM; it is converted with this
process's offset between the two clocks, taken at the moment of writing.

Why wrappers and not a vLLM option: vLLM records these timestamps but
exports only their differences, as histograms (queue, prefill, TTFT),
which is what ``benchmarks.vs_vllm`` splits its TTFT with; the hand-offs are
what is left over, and splitting them needs the timestamps themselves. The
wrappers call the wrapped method unchanged and only read its arguments and
the request's stats afterwards. This module is a benchmark's instrument:
nothing shipped imports it, and no shipped process loads it (the plugin's
metadata is outside every installed package).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

# the trace file; unset: the plugin does nothing
TRACE_ENV = "FUZZSERVE_HANDOFF_TRACE"
# a folder holding only this plugin's entry-point metadata: on PYTHONPATH, vLLM loads the plugin
PLUGIN_DIR = Path(__file__).resolve().parent / "handoff_plugin"

logger = logging.getLogger("vllm.fuzzserve.handoff_hooks")  # under vLLM's logger: its handlers and level


class TraceWriter:
    """Line-buffered JSON lines: each record is on disk when written (the server is killed, never asked to flush)."""

    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 -- held for the object's life, closed when it stops

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")


def install(path: Path) -> None:
    """Wrap vLLM's frontend in this process (idempotent: a second call does nothing)."""
    from vllm.v1.engine.core_client import AsyncMPClient
    from vllm.v1.engine.output_processor import OutputProcessor

    if getattr(OutputProcessor.process_outputs, "_handoff_traced", False):
        return
    writer = TraceWriter(path)
    sent: dict[str, float] = {}
    pid = os.getpid()  # several replicas' frontends may write to one trace: each record says whose it is

    add_request_async = AsyncMPClient.add_request_async

    @functools.wraps(add_request_async)
    async def traced_add(self, request, *args, **kwargs):
        sent[request.request_id] = time.monotonic()
        return await add_request_async(self, request, *args, **kwargs)

    process_outputs = OutputProcessor.process_outputs

    @functools.wraps(process_outputs)
    def traced_process(self, engine_core_outputs, engine_core_timestamp=None, *args, **kwargs):
        got = time.monotonic()
        first = {}
        for out in engine_core_outputs:
            state = self.request_states.get(out.request_id)
            if state is not None and state.is_prefilling and state.stats is not None:
                first[out.request_id] = state.stats
        result = process_outputs(self, engine_core_outputs, engine_core_timestamp, *args, **kwargs)
        done = time.monotonic()
        if engine_core_timestamp is not None:
            writer.write(
                {"step": engine_core_timestamp, "outputs": len(engine_core_outputs), "first": len(first), "pid": pid}
            )
        offset = time.time() - time.monotonic()
        for rid, stats in first.items():
            writer.write(
                {
                    "rid": rid,
                    "pid": pid,
                    "arrival": stats.arrival_time - offset,
                    "sent": sent.pop(rid, None),
                    "queued": stats.queued_ts or None,
                    "scheduled": stats.scheduled_ts or None,
                    "core_out": engine_core_timestamp,
                    "got": got,
                    "done": done,
                    "ttft": stats.first_token_latency,
                }
            )
        return result

    # the marker install() checks, and the wrappers put in place of vLLM's methods (what this instrument is)
    traced_process._handoff_traced = True  # type: ignore[attr-defined]  # a marker on the wrapper function
    AsyncMPClient.add_request_async = traced_add
    OutputProcessor.process_outputs = traced_process  # type: ignore[method-assign]  # wraps vLLM's method in place


def install_from_env() -> None:
    """The plugin's entry point: trace to :data:`TRACE_ENV`'s file, if it is set."""
    path = os.environ.get(TRACE_ENV)
    if path:
        install(Path(path))
        logger.info("hand-off trace of process %d to %s", os.getpid(), path)


def plugin_env(trace: Path, pythonpath: str | None = None) -> dict[str, str]:
    """The environment that makes the vLLM processes started with it trace to ``trace``."""
    return {TRACE_ENV: str(trace), "PYTHONPATH": os.pathsep.join(p for p in (str(PLUGIN_DIR), pythonpath) if p)}
