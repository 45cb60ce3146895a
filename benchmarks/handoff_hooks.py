r"""Per-request timestamps of the hand-offs between vLLM's frontend and EngineCore, for one benchmark server.

    python -m benchmarks.handoff_hooks --trace FILE -- --model M ...   # vLLM's OpenAI server, traced

Runs vLLM's own OpenAI server (``vllm.entrypoints.openai.api_server``, the
arguments after ``--`` are its own) with two read-only wrappers installed in
the API server's process, which write one JSON line per request when its
first token reaches the frontend, and one line per EngineCore step output:

* ``AsyncMPClient.add_request_async``: when the frontend hands the request
  to its ZMQ socket (``sent``, monotonic);
* ``OutputProcessor.process_outputs``: the EngineCore timestamps vLLM
  already carries to the frontend (``queued``, ``scheduled``: the
  scheduler's events; ``core_out``: when EngineCore built the step's
  outputs, all monotonic) and when the frontend began and ended processing
  that output (``got``, ``done``), beside the request's ``arrival`` (vLLM's
  wall-clock arrival, converted to monotonic here) and the TTFT vLLM itself
  records (``ttft``).

Every clock here is the host's CLOCK_MONOTONIC (``time.monotonic``), which
is one clock for every process of the host, so EngineCore's timestamps and
the frontend's subtract directly. Only the ``arrival`` is wall-clock in
vLLM; it is converted with this process's offset between the two clocks,
taken at the moment of writing.

Why wrappers in the server's process and not a vLLM option: vLLM records
these timestamps but exports only their differences, as histograms
(``queue``, ``prefill``, TTFT), which is what ``benchmarks.vs_vllm`` splits
its TTFT with; the hand-offs are what is left over, and splitting them needs
the timestamps themselves. The wrappers call the wrapped method unchanged
and only read its arguments and the request's stats afterwards. This module
is a benchmark's instrument: nothing shipped imports it.
"""

from __future__ import annotations

import argparse
import functools
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

FIELDS = ("arrival", "sent", "queued", "scheduled", "core_out", "got", "done")


class TraceWriter:
    """Line-buffered JSON lines: each record is on disk when written (the server is killed, never asked to flush)."""

    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1)

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
            writer.write({"step": engine_core_timestamp, "outputs": len(engine_core_outputs), "first": len(first)})
        offset = time.time() - time.monotonic()
        for rid, stats in first.items():
            writer.write({"rid": rid, "arrival": stats.arrival_time - offset, "sent": sent.pop(rid, None),
                          "queued": stats.queued_ts or None, "scheduled": stats.scheduled_ts or None,
                          "core_out": engine_core_timestamp, "got": got, "done": done,
                          "ttft": stats.first_token_latency})
        return result

    traced_process._handoff_traced = True
    AsyncMPClient.add_request_async = traced_add
    OutputProcessor.process_outputs = traced_process


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m benchmarks.handoff_hooks --trace FILE -- <vLLM server arguments>")
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m benchmarks.handoff_hooks")
    ap.add_argument("--trace", type=Path, required=True, help="JSON lines, appended")
    args = ap.parse_args(argv[:cut])
    install(args.trace)
    sys.argv = ["vllm.entrypoints.openai.api_server", *argv[cut + 1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
