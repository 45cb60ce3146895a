"""The ``early_submit`` patch: a streamed request's first step (where vLLM's stream asks the engine for the request)
runs when the handler returns, not when the response starts; the stream's chunks, its end, its errors and a
client that leaves are what upstream's stream gives.

The wrapper's logic is tested on plain async generators; what the patch claims of vLLM is tested on vLLM's real
OpenAI app and engine (``testkit.stream_start_probe``), patched and with the patch switched off (the control that
fails when it is off).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncGenerator

import pytest

from patches.early_submit import ENABLE_ENV, EarlyStream, early, opted_in
from patches.framework.switches import OFF_ENV
from testkit.child_probe import run_probe


def _stream(log: list[str], items=("a", "b", "c"), wait: asyncio.Event | None = None):
    async def gen():
        log.append("started")
        try:
            if wait is not None:
                await wait.wait()
            for item in items:
                yield item
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        except GeneratorExit:
            log.append("closed")
            raise

    return gen()


def test_the_first_step_runs_before_anyone_iterates_and_upstreams_stream_does_not():
    async def main():
        log: list[str] = []
        control: list[str] = []
        stream = EarlyStream(_stream(log))
        plain = _stream(control)
        await asyncio.sleep(0)  # one turn of the loop
        assert log == ["started"] and control == []  # the control: an async generator waits to be iterated
        assert [x async for x in stream] == ["a", "b", "c"]
        await plain.aclose()

    asyncio.run(main())


def test_an_empty_stream_ends_and_an_error_in_the_first_step_reaches_the_reader():
    async def broken():
        raise ValueError("upstream's error")
        yield  # pragma: no cover

    async def main():
        assert [x async for x in EarlyStream(_stream([], items=()))] == []
        with pytest.raises(ValueError, match="upstream's error"):
            await EarlyStream(broken()).__anext__()

    asyncio.run(main())


def test_a_reader_cancelled_while_it_waits_for_the_first_chunk_cancels_the_stream():
    async def main():
        log: list[str] = []
        stream = EarlyStream(_stream(log, wait=asyncio.Event()))
        reader = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.01)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        await asyncio.sleep(0)
        assert log == ["started", "cancelled"]

    asyncio.run(main())


def test_a_stream_dropped_before_it_was_read_is_cancelled():
    async def main():
        log: list[str] = []
        stream = EarlyStream(_stream(log, wait=asyncio.Event()))
        await asyncio.sleep(0.01)
        del stream
        gc.collect()
        for _ in range(3):
            await asyncio.sleep(0)
        assert log == ["started", "cancelled"]

    asyncio.run(main())


def test_aclose_while_the_first_step_runs_cancels_it_and_closes_the_stream():
    async def main():
        log: list[str] = []
        stream = EarlyStream(_stream(log, wait=asyncio.Event()))
        await asyncio.sleep(0.01)
        await stream.aclose()  # not "already running": the first step is over before the close
        assert log == ["started", "cancelled"]
        log2: list[str] = []
        read = EarlyStream(_stream(log2))
        assert await read.__anext__() == "a"
        await read.aclose()
        assert log2 == ["started", "closed"]

    asyncio.run(main())


def test_asend_and_athrow_behave_as_upstreams_generator():
    async def main():
        log: list[str] = []
        stream = EarlyStream(_stream(log, wait=asyncio.Event()))
        with pytest.raises(TypeError, match="non-None"):
            await stream.asend("x")  # as a just-started async generator
        await asyncio.sleep(0.01)  # the first step runs, and waits
        with contextlib.suppress(KeyError):  # thrown in once the first step is stopped: not "already running"
            await stream.athrow(KeyError("k"))
        assert log == ["started", "cancelled"]
        read = EarlyStream(_stream([]))
        assert await read.asend(None) == "a" and await read.asend(None) == "b"

    asyncio.run(main())


def test_only_a_streamed_requests_stream_is_started():
    class Request:
        def __init__(self, stream):
            self.stream = stream

    async def main():
        log: list[str] = []
        gen = _stream(log)
        assert early(gen, Request(False)) is gen  # a non-streamed request's handler reads its own generator
        response = object()  # an error or a full response: returned as it is
        assert early(response, Request(True)) is response
        started = early(gen, Request(True))
        # an AsyncGenerator, as upstream's stream: ray.serve.llm's engine streams a response only if it is one
        assert isinstance(started, EarlyStream) and isinstance(started, AsyncGenerator)
        assert [x async for x in started] == ["a", "b", "c"]

    asyncio.run(main())


def test_the_patch_is_off_unless_opted_in(monkeypatch):
    for value, on in (("1", True), (" 1 ", True), ("", False), ("0", False), ("yes", False)):
        monkeypatch.setenv(ENABLE_ENV, value)
        assert opted_in() is on
    monkeypatch.delenv(ENABLE_ENV)
    assert opted_in() is False


@pytest.fixture(scope="module")
def probes(fixture_model):
    """vLLM's real app and engine, opted in and by default, where the patch is off (one-process engines: the patch
    is the frontend's)."""
    one_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    return {
        on: run_probe(
            "testkit.stream_start_probe",
            str(fixture_model),
            env={**one_process, OFF_ENV: "", ENABLE_ENV: "1" if on else ""},
        )
        for on in (True, False)
    }


@pytest.mark.engine
def test_vllms_app_gives_the_engine_a_streamed_request_before_its_response_starts(probes):
    """Opted in, completions and chat reach the engine before the response starts; by default (the control),
    after it, as upstream; the streams are the same, token for token."""
    for kind in ("completion", "chat"):
        on, off = probes[True]["streams"][kind], probes[False]["streams"][kind]
        assert on["added"] == off["added"] == 1 and on["started"] and off["started"]
        assert on["added_before_start"] is True, on
        assert off["added_before_start"] is False, off
        # streamed in pieces, not one body; not one chunk per token: vLLM puts several tokens in one chunk when its
        # output handler falls behind (a clean-clone CI run read 7 chunks for 8 tokens)
        assert on["chunks"] > 1 and off["chunks"] > 1, (on, off)
        assert on["text"] and on["text"] == off["text"] and on["done"] and off["done"]


@pytest.mark.engine
def test_a_client_gone_once_the_engine_has_its_request_gets_it_aborted(probes):
    """A client that disconnects as soon as its request is added (patched: before the response starts) has it
    aborted, nothing left unfinished in the engine; off, the same with upstream's later add."""
    gone = probes[True]["gone"]
    assert gone["added"] == 1 and gone["aborted"] >= 1 and gone["unfinished_after"] == 0, gone
    off = probes[False]["gone"]
    assert off["unfinished_after"] == 0 and (off["added"] == 0 or off["aborted"] >= 1), off
