"""vLLM's real OpenAI app and engine, asked when a streamed request reaches the engine: before or after its
response starts. ``python -m testkit.stream_start_probe MODEL`` prints one JSON line.

The app is the one ``vllm serve`` builds (``build_app`` and ``init_app_state`` over ``build_async_engine_client``,
the fixture model, one-process engine); the probe is its ASGI server, as uvicorn is (scope with ASGI spec 2.3,
uvicorn's), and marks, on one sequence, when the engine client's ``add_request`` and ``abort`` are called and
when the app sends its response's start. It sends:

* a streamed completion and a streamed chat completion, read to the end (``streams``: for each, whether the
  request was added before the response started, its chunks, its text);
* a streamed completion whose client disconnects as soon as the engine has the request (``gone``: the request
  added, aborted, and nothing unfinished left in the engine) or, where the request is added only once the
  response starts, as soon as the response starts.

Run as a child process so that the patches' switches (``FUZZSERVE_EARLY_SUBMIT``, ``FUZZSERVE_PATCHES_OFF``)
apply to a fresh vLLM import.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import MutableMapping
from typing import Any

MAX_TOKENS = 8
GONE_MAX_TOKENS = 200  # far more steps than the disconnect takes: a request that ran to its end was not aborted


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},  # uvicorn's, and what Ray Serve's server hands on
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }


def _read_sse(body: str) -> dict[str, Any]:
    """A streamed response's events: how many carried a choice, the text they carried (completions' ``text``,
    chat's ``delta.content``), and whether it ended with ``[DONE]``."""
    events = [e.removeprefix("data: ") for e in body.split("\n\n") if e.startswith("data: ")]
    choices = [c for e in events if e != "[DONE]" for c in json.loads(e).get("choices", [])]
    text = "".join(c.get("text") or (c.get("delta") or {}).get("content") or "" for c in choices)
    return {"chunks": len(choices), "text": text, "done": bool(events) and events[-1] == "[DONE]"}


async def probe(model: str) -> dict[str, Any]:
    """The record ``main`` prints (see the module docstring).

    Long on purpose: one linear script inside the engine client's context, whose closures (the marked
    ``add_request`` and ``abort``, the ASGI ``receive`` and ``send``) share one sequence of marks; split into
    functions, its steps would pass that shared state around instead of reading in order."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", model, "--served-model-name", "fixture", "--dtype", "float32", "--enforce-eager"]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args([*argv, "--max-model-len", "512"])
    seq = itertools.count()
    marks: list[tuple[int, str, str]] = []  # (sequence, what, request path or id)
    added = asyncio.Event()

    async with build_async_engine_client(args) as client:
        engine: Any = client  # vLLM's AsyncLLM: add_request, abort and the unfinished count are its own
        tasks = await engine.get_supported_tasks()
        app = build_app(args, tasks, engine.model_config)
        await init_app_state(engine, app.state, args, tasks)
        add_request, abort = engine.add_request, engine.abort

        async def marked_add(request_id, *a, **kw):
            marks.append((next(seq), "add", request_id))
            added.set()
            return await add_request(request_id, *a, **kw)

        async def marked_abort(request_id, *a, **kw):
            marks.append((next(seq), "abort", str(request_id)))
            return await abort(request_id, *a, **kw)

        engine.add_request, engine.abort = marked_add, marked_abort  # the instance's: what vLLM's handlers call

        async def call(path: str, payload: dict[str, Any], gone: bool = False) -> dict[str, Any]:
            body = json.dumps(payload).encode()
            sent, started, chunks = [False], asyncio.Event(), []
            start_mark: list[int] = []
            added.clear()

            async def receive() -> dict[str, Any]:
                if not sent[0]:
                    sent[0] = True
                    return {"type": "http.request", "body": body, "more_body": False}
                if gone:  # the client leaves as soon as the engine has the request, or the response started
                    waits = [asyncio.ensure_future(added.wait()), asyncio.ensure_future(started.wait())]
                    try:
                        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        for w in waits:
                            w.cancel()
                else:
                    await asyncio.Event().wait()  # a client that stays: no disconnect until the app is done
                return {"type": "http.disconnect"}

            async def send(message: MutableMapping[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    start_mark.append(next(seq))
                    marks.append((start_mark[0], "start", path))
                    started.set()
                elif message.get("body"):
                    chunks.append(message["body"].decode())

            before = len(marks)
            await app(_scope(path, body), receive, send)
            mine = marks[before:]
            adds = [m for m in mine if m[1] == "add"]
            return {
                "added_before_start": bool(adds and start_mark and adds[0][0] < start_mark[0]),
                "added": len(adds),
                "aborted": sum(m[1] == "abort" for m in mine),
                "started": bool(start_mark),
                **_read_sse("".join(chunks)),
            }

        common = {"model": "fixture", "temperature": 0, "stream": True}
        streams = {
            "completion": await call(
                "/v1/completions", {**common, "prompt": "one two three", "max_tokens": MAX_TOKENS}
            ),
            "chat": await call(
                "/v1/chat/completions",
                {**common, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": MAX_TOKENS},
            ),
        }
        gone = await call(
            "/v1/completions",
            {**common, "prompt": "four five six", "max_tokens": GONE_MAX_TOKENS, "ignore_eos": True},
            gone=True,
        )
        for _ in range(200):  # the abort reaches the engine's output processor within a few turns
            if engine.get_num_unfinished_requests() == 0:
                break
            await asyncio.sleep(0.05)
        gone["unfinished_after"] = engine.get_num_unfinished_requests()
        gone.pop("text")
    return {"streams": streams, "gone": gone}


def main(argv: list[str] | None = None) -> None:
    from serve_app.engine.engine_env import use_engine_env

    use_engine_env()
    (model,) = sys.argv[1:] if argv is None else argv
    sys.stdout.write(json.dumps(asyncio.run(probe(model))) + "\n")


if __name__ == "__main__":
    main()
