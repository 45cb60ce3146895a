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

And the request's way in and its first bytes out, one ``edge`` record per
HTTP request when it ends, written by two more wrappers of ASGI callables:

* ``Starlette.__call__`` (``edge: app``; vLLM's OpenAI app is a FastAPI
  app, in vLLM's server and in a replica alike): when the app was entered
  (``in``), when its first response body left it (``first``), when it
  returned (``end``), and the frontend requests it added (``rids``, read in
  ``add_request_async`` through a context variable the wrapper sets);
* vLLM's renderer, in the app edge's record: when tokenizing was asked for
  (``tok_in``) and its caller resumed with the tokens (``tok_out``; upstream
  tokenizes on a thread pool, the ``inline_render`` patch a short prompt
  through the synchronous ``tokenize_prompts`` or ``render_cmpl``, marked
  the same), and when the whole render returned to its caller
  (``rendered``; vLLM's arrival is the render's first line), then when the
  app sent its response's start (``started``, by the edge's send) and when
  vLLM's engine client was asked to add the request (``gen``,
  ``AsyncLLM.add_request``). The project's
  patches are applied before these marks (``patches.register``, which
  applies each once and obeys their switches), so the marks wrap them and
  see a render that the patch ends without upstream's methods;
* in a Ray Serve replica, ``Replica._direct_ingress_asgi`` (``edge: ray``;
  Ray's HTTP server on the replica's main event loop, before the hop to the
  thread that runs the app): the same three times, its ``first`` when the
  body was handed to uvicorn's transport (each ``first``: as the bytes are
  handed on, before the send returns).

Both carry the request's ``X-Request-Id`` (``xrid``; Ray's middleware sets
one on every request), which joins the two edges of one request; ``rids``
joins the app's edge to the first-token record, and the app's ``prompt`` (a
digest of the body's prompt, or of its last chat message; :func:`prompt_digest`,
read from the body the app received, when the request has ended) joins it
to the client's request, whose prompts the benchmark wrote.

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

import contextvars
import functools
import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

# the trace file; unset: the plugin does nothing
TRACE_ENV = "FUZZSERVE_HANDOFF_TRACE"
# a folder holding only this plugin's entry-point metadata: on PYTHONPATH, vLLM loads the plugin
PLUGIN_DIR = Path(__file__).resolve().parent / "handoff_plugin"

logger = logging.getLogger("vllm.fuzzserve.handoff_hooks")  # under vLLM's logger: its handlers and level


# the app edge's record of the request the current task serves (None outside one): add_request_async adds its rid
_EDGE: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("fuzzserve_handoff_edge", default=None)


class TraceWriter:
    """Line-buffered JSON lines: each record is on disk when written (the server is killed, never asked to flush)."""

    def __init__(self, path: Path):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 -- held for the object's life, closed when it stops

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")


def load_trace(path: Path) -> list[dict[str, Any]]:
    """Every record of a trace :class:`TraceWriter` wrote, in the order written."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


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
        edge = _EDGE.get()
        if edge is not None:
            edge["rids"].append(request.request_id)
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
    install_edges(writer, pid)


BODY_CAP = 1 << 20  # bytes of a request body kept for its prompt's digest
# every method the hooks replace, as (module, class, attribute): what a test puts back after installing them
WRAPPED = (
    ("vllm.v1.engine.core_client", "AsyncMPClient", "add_request_async"),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs"),
    ("starlette.applications", "Starlette", "__call__"),
    ("vllm.renderers.base", "BaseRenderer", "tokenize_prompts_async"),
    ("vllm.renderers.base", "BaseRenderer", "tokenize_prompts"),
    ("vllm.renderers.base", "BaseRenderer", "render_cmpl_async"),
    ("vllm.renderers.base", "BaseRenderer", "render_chat_async"),
    ("vllm.v1.engine.async_llm", "AsyncLLM", "add_request"),
    ("ray.serve._private.replica", "Replica", "_direct_ingress_asgi"),
)


def prompt_digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def body_prompt(body: bytes) -> str | None:
    """The digest of a completions body's ``prompt`` or a chat body's last message, or None."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    prompt = data.get("prompt") if isinstance(data, dict) else None
    if prompt is None and isinstance(data, dict) and data.get("messages"):
        prompt = data["messages"][-1].get("content")
        if isinstance(prompt, list):  # content parts: their text, in order
            prompt = "".join(part.get("text", "") for part in prompt if isinstance(part, dict))
    return prompt_digest(prompt) if isinstance(prompt, str) else None


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def traced_asgi(call, writer: TraceWriter, edge: str, pid: int):
    """An ASGI method ``(self, scope, receive, send)`` wrapped to write one ``edge`` record per HTTP request.

    The app edge records only the outermost app of a request (a mounted app inside it is the same request)."""

    @functools.wraps(call)
    async def wrapper(self, scope, receive, send):
        if scope.get("type") != "http" or (edge == "app" and _EDGE.get() is not None):
            return await call(self, scope, receive, send)
        record: dict[str, Any] = {
            "edge": edge,
            "pid": pid,
            "xrid": _header(scope, b"x-request-id"),
            "path": scope.get("path"),
            "in": time.monotonic(),
            "first": None,
            "rids": [],
        }
        token = _EDGE.set(record) if edge == "app" else None
        body = bytearray()  # the app edge's: the body its app read, for the prompt's digest

        async def tapped_receive():
            message = await receive()
            if message.get("type") == "http.request" and len(body) < BODY_CAP:
                body.extend(message.get("body", b""))
            return message

        async def timed_send(message):
            # taken as the bytes are handed on: a client on real-time scheduling may read them before send returns
            if record["first"] is None and message.get("type") == "http.response.body" and message.get("body"):
                record["first"] = time.monotonic()
            elif message.get("type") == "http.response.start":
                record.setdefault("started", time.monotonic())
            await send(message)

        try:
            return await call(self, scope, tapped_receive if token is not None else receive, timed_send)
        finally:
            record["end"] = time.monotonic()
            if token is not None:
                _EDGE.reset(token)
                record["prompt"] = body_prompt(bytes(body))
            writer.write(record)

    wrapper._handoff_traced = True  # type: ignore[attr-defined]  # the marker install_edges() checks
    return wrapper


def timed_stage(method, before: str | None, after: str):
    """An async method wrapped to mark, in the app edge's record of the request it serves, when it was called
    (``before``) and when its caller resumed with the result (``after``); the first call of a request only."""

    @functools.wraps(method)
    async def wrapper(*args, **kwargs):
        record = _EDGE.get()
        if record is not None and before is not None:
            record.setdefault(before, time.monotonic())
        result = await method(*args, **kwargs)
        if record is not None:
            record.setdefault(after, time.monotonic())
        return result

    wrapper._handoff_traced = True  # type: ignore[attr-defined]  # the marker install_edges() checks
    return wrapper


def timed_sync_stage(method, before: str, after: str):
    """:func:`timed_stage` for a synchronous method (the ``inline_render`` patch's tokenizing)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        record = _EDGE.get()
        if record is not None:
            record.setdefault(before, time.monotonic())
        result = method(*args, **kwargs)
        if record is not None:
            record.setdefault(after, time.monotonic())
        return result

    wrapper._handoff_traced = True  # type: ignore[attr-defined]  # the marker install_edges() checks
    return wrapper


def install_render_marks() -> None:
    """Mark vLLM's renderer stages inside ``front_in``: tokenizing (on the renderer's thread pool, or inline) and
    the whole render (vLLM's arrival is its first line)."""
    from vllm.renderers.base import BaseRenderer
    from vllm.v1.engine.async_llm import AsyncLLM

    import patches

    if getattr(BaseRenderer.tokenize_prompts_async, "_handoff_traced", False):
        return
    # the project's patches first (as this process's vLLM plugin would apply them; once, switches obeyed), so that
    # the marks wrap them whichever plugin vLLM loads first
    patches.register()
    # each wraps vLLM's method in place (what this instrument is)
    tokenize = timed_stage(BaseRenderer.tokenize_prompts_async, "tok_in", "tok_out")
    BaseRenderer.tokenize_prompts_async = tokenize  # type: ignore[method-assign]
    BaseRenderer.tokenize_prompts = timed_sync_stage(BaseRenderer.tokenize_prompts, "tok_in", "tok_out")  # type: ignore[method-assign]
    BaseRenderer.render_cmpl_async = timed_stage(BaseRenderer.render_cmpl_async, None, "rendered")  # type: ignore[method-assign]
    BaseRenderer.render_chat_async = timed_stage(BaseRenderer.render_chat_async, None, "rendered")  # type: ignore[method-assign]
    # and the way from the render to EngineCore: vLLM's engine client asked to add the request (the response's
    # start, which the app sends first, is marked by the app edge's send)
    AsyncLLM.add_request = timed_stage(AsyncLLM.add_request, "gen", "added")  # type: ignore[method-assign]


def install_edges(writer: TraceWriter, pid: int) -> None:
    """Wrap Starlette's app entry, and Ray's direct-ingress entry where this process is a Serve replica."""
    from starlette.applications import Starlette

    install_render_marks()
    if not getattr(Starlette.__call__, "_handoff_traced", False):
        Starlette.__call__ = traced_asgi(Starlette.__call__, writer, "app", pid)  # type: ignore[method-assign]
    replica = sys.modules.get("ray.serve._private.replica")  # imported only where this process is a replica
    if replica is not None and not getattr(replica.Replica._direct_ingress_asgi, "_handoff_traced", False):
        replica.Replica._direct_ingress_asgi = traced_asgi(replica.Replica._direct_ingress_asgi, writer, "ray", pid)


def install_from_env() -> None:
    """The plugin's entry point: trace to :data:`TRACE_ENV`'s file, if it is set."""
    path = os.environ.get(TRACE_ENV)
    if path:
        install(Path(path))
        logger.info("hand-off trace of process %d to %s", os.getpid(), path)


def plugin_env(trace: Path, pythonpath: str | None = None) -> dict[str, str]:
    """The environment that makes the vLLM processes started with it trace to ``trace``."""
    return {TRACE_ENV: str(trace), "PYTHONPATH": os.pathsep.join(p for p in (str(PLUGIN_DIR), pythonpath) if p)}
