"""A minimal OpenAI-compatible server that streams made-up tokens: a target for testing and measuring the generator.

Not an LLM and not a mock of one: its job is to be an HTTP peer whose
behaviour is known exactly, so that (a) the generator's own accounting can be
checked (every request it sends is answered in a known way and counted here)
and (b) the generator's capacity can be measured without an engine in the way
(benchmarks/loadgen_capacity.py, side by side with vLLM's benchmark client).

    python -m load_tests.echo_server --port 8100 [--itl-ms 0]

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (stream or
not; ``max_tokens`` tokens), ``GET /v1/models``, ``GET /stats`` (what it saw).
A prompt (or the last chat message) containing one of these words asks for a
behaviour: ``!400`` (an OpenAI 400 naming ``vllm_xargs.fuzz_strength``),
``!500``, ``!truncate`` (a stream that ends cleanly but without ``[DONE]``),
``!drop`` (the connection closed mid-stream), ``!error-event``
(an error event mid-stream), ``!slow`` (100 ms per token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web


BEHAVIOURS = ("!400", "!500", "!truncate", "!drop", "!error-event", "!slow")


class EchoServer:
    def __init__(self, itl_ms: float = 0.0):
        self.itl_s = itl_ms / 1000
        self.stats = {"received": 0, "completed": 0, "disconnected": 0, "in_flight": 0, "max_in_flight": 0,
                      "by_behaviour": {}}

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.get_stats)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fixture", "object": "model"}]})

    async def get_stats(self, request: web.Request) -> web.Response:
        """What the server saw; ``?reset=1`` also restarts the in-flight high-water mark."""
        out = web.json_response(self.stats)
        if request.query.get("reset"):
            self.stats["max_in_flight"] = self.stats["in_flight"]
        return out

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.stats["received"] += 1
        self.stats["in_flight"] += 1
        self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])
        try:
            return await self._answer(request)
        finally:
            self.stats["in_flight"] -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "the request body is not valid JSON", None)
        chat = request.path.endswith("/chat/completions")
        text = ((body.get("messages") or [{}])[-1] or {}).get("content", "") if chat else body.get("prompt", "")
        behaviour = next((b for b in BEHAVIOURS if b in str(text)), "")
        by = self.stats["by_behaviour"]
        by[behaviour or "normal"] = by.get(behaviour or "normal", 0) + 1
        if behaviour == "!400":
            return _error(400, "vllm_xargs.fuzz_strength must be >= 0", "vllm_xargs.fuzz_strength")
        if behaviour == "!500":
            return _error(500, "internal error (asked for)", None)
        n = int(body.get("max_tokens") or 16)
        itl = 0.1 if behaviour == "!slow" else self.itl_s
        created = int(time.time())
        if not body.get("stream"):
            await asyncio.sleep(itl * n)
            self.stats["completed"] += 1
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": " x" * n}} if chat else {"text": " x" * n})
            return web.json_response({"id": "echo", "object": "chat.completion" if chat else "text_completion",
                                      "created": created, "model": body.get("model"), "choices": [choice],
                                      "usage": {"prompt_tokens": len(str(text).split()), "completion_tokens": n,
                                                "total_tokens": len(str(text).split()) + n}})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(n):
                if behaviour == "!truncate" and i == n // 2:
                    await resp.write_eof()  # a well-formed end of the response, but no [DONE]
                    return resp
                if behaviour == "!drop" and i == n // 2:
                    request.transport.close()  # the connection drops mid-stream
                    return resp
                if behaviour == "!error-event" and i == n // 2:
                    await resp.write(b'data: {"error": {"message": "engine failed (asked for)", "code": 500}}\n\n')
                    return resp
                delta = {"delta": {"content": " x"}} if chat else {"text": " x"}
                chunk = {"id": "echo", "created": created, "model": body.get("model"),
                         "choices": [{"index": 0, **delta, "finish_reason": "length" if i == n - 1 else None}]}
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if itl:
                    await asyncio.sleep(itl)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": len(str(text).split()), "completion_tokens": n}
                await resp.write(b"data: " + json.dumps({"id": "echo", "choices": [], "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.stats["completed"] += 1
        except (ConnectionResetError, asyncio.CancelledError):  # the client went away
            self.stats["disconnected"] += 1
        return resp


def _error(status: int, message: str, param: str | None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                         "server_error", "param": param, "code": status}}, status=status)


async def start(port: int = 0, itl_ms: float = 0.0, host: str = "127.0.0.1") -> tuple[web.AppRunner, EchoServer, int]:
    """Start on the running event loop; returns (runner, server, port). ``await runner.cleanup()`` stops it."""
    server = EchoServer(itl_ms)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, server, site._server.sockets[0].getsockname()[1]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--itl-ms", type=float, default=0.0, help="delay between streamed tokens")
    args = ap.parse_args(argv)
    server = EchoServer(args.itl_ms)
    web.run_app(server.app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
