"""A minimal OpenAI-compatible server that streams made-up tokens: a target for testing and measuring the generator.

Not an LLM and not a mock of one: its job is to be an HTTP peer whose
behaviour is known exactly, so that (a) the generator's own accounting can be
checked (every request it sends is answered in a known way and counted here)
and (b) the generator's capacity can be measured without an engine in the way
(side by side with vLLM's benchmark client: docs/results_log.md, the loadgen_capacity entry).

    python -m testkit.echo_server --port 8100 [--itl-ms 0]

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (stream or
not; ``max_tokens`` tokens), ``GET /v1/models``, ``GET /health``, ``GET /stats`` (what it saw),
``GET /metrics``. A prompt (or the last chat message) containing one of these
words asks for a behaviour: ``!400`` (an OpenAI 400 naming
``vllm_xargs.fuzz_strength``), ``!500``, ``!truncate`` (a stream that ends
cleanly but without ``[DONE]``), ``!drop`` (the connection closed
mid-stream), ``!error-event`` (an error event mid-stream), ``!slow`` (100 ms
per token), ``!empty-text`` (every token's text decodes to ``""``, as a fuzzed
greedy answer's often does). Latencies are deterministic: ``--ttft-ms``
before the first token, ``--itl-ms`` between tokens (a chat stream announces
the speaker at once, before the first token, as vLLM's does).

``refused_xargs`` are ``vllm_xargs`` keys it refuses (400 naming
``vllm_xargs.KEY``, as the project's guard does), and :meth:`EchoServer.redeploy`
does what a ``serve deploy`` of a changed config does to it: every replica
replaced by a new one, the old ones stopped (health 0), the keys allowed.
With them a test can play the operator of the CLI's ``--url`` operations.

``/metrics`` makes it a target for the whole stress-test CLI, not only its
generator: it serves, in Ray's format, the vLLM counters of ``--replicas``
pretend engine replicas (requests are dealt round-robin), kept exactly as
an honest engine would (prompt tokens all ``local_compute``, one finish per
request: ``length``, or ``abort`` when the client went away), and Serve's
health gauge for each. ``--fault KIND`` breaks it on purpose after
``--fault-after`` requests, so that the CLI's verdict can be shown to fail
end to end for each thing it checks (``FAULTS``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from aiohttp import web

from load_tests.observe.counters import HEALTH_GAUGE

BEHAVIOURS = ("!400", "!500", "!truncate", "!drop", "!error-event", "!slow", "!empty-text")

# What --fault breaks (after --fault-after requests), and what the CLI's verdict must then say.
FAULTS = {
    "decreasing_counter": "replica echo-0's prompt-token counters drop (a decrease within one replica's life)",
    "negative_counter": "replica echo-0 reports external_kv_transfer < 0 (local_compute raised to keep the sum)",
    "sum_mismatch": "replica echo-0's local_compute is one more than its prompt tokens",
    "accounting_violation": "replica echo-0's accounting-violation counter grows (a kind nothing injects)",
    "lost_stream": "every 5th stream ends without [DONE] and without an error event",
    "replica_dies": "replica echo-1 stops serving; its gauges vanish and Serve's health gauge says 0",
    "scrape_fails": "/metrics answers 503 from then on",
    "undercount": "replica echo-0 does not count every 3rd request it finishes (client/server disagree)",
    "stuck": "replica echo-0 reports a running request forever (never quiescent)",
}


class EchoStats(TypedDict):
    """What the server saw (``GET /stats``): requests received, answered in full, abandoned by their client, in
    flight now and at most, and how many asked for each behaviour (``normal``: none)."""

    received: int
    completed: int
    disconnected: int
    in_flight: int
    max_in_flight: int
    by_behaviour: dict[str, int]


class PretendReplica:
    """The counters one engine replica would export, kept honestly unless the server's fault says otherwise."""

    def __init__(self, name: str):
        self.name = name
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.running = 0
        self.violations = 0
        self.alive = True


class EchoServer:
    def __init__(
        self,
        itl_ms: float = 0.0,
        replicas: int = 2,
        fault: str | None = None,
        fault_after: int = 20,
        ttft_ms: float = 0.0,
        empty_text: bool = False,
        refused_xargs: tuple[str, ...] = (),
        record_bodies: str | None = None,
    ):
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; known: {sorted(FAULTS)}")
        self.itl_s = itl_ms / 1000
        self.ttft_s = ttft_ms / 1000
        self.empty_text = empty_text  # every answer as if it had the !empty-text word
        self.stats: EchoStats = {
            "received": 0,
            "completed": 0,
            "disconnected": 0,
            "in_flight": 0,
            "max_in_flight": 0,
            "by_behaviour": {},
        }
        self.replicas = [PretendReplica(f"echo-{i}") for i in range(max(1, replicas))]
        self.refused_xargs = set(refused_xargs)
        self.fault, self.fault_after = fault, fault_after
        self._dealt = 0
        self._drop_at: int | None = None  # echo-0's prompt_tokens when its counter dropped (decreasing_counter)
        # every parsed request body, one JSON line each (what each client sent: tests compare two clients' bodies)
        self._bodies = open(record_bodies, "a", buffering=1) if record_bodies else None  # noqa: SIM115 -- held for the object's life, closed when it stops

    @property
    def broken(self) -> bool:
        return self.fault is not None and self.stats["received"] > self.fault_after

    def app(self) -> web.Application:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)  # as vLLM's server: GuideLLM asks it before it sends
        app.router.add_get("/stats", self.get_stats)
        app.router.add_get("/metrics", self.metrics)
        return app

    def redeploy(self, allow_xargs: tuple[str, ...] = ()) -> list[str]:
        """A new replica for every live one, the old ones stopped (Serve's health gauge 0, their counters kept as
        a stopped replica's stay exported; in-flight requests finish on them), ``allow_xargs`` allowed from now
        on: the new replicas' names."""
        old = [r for r in self.replicas if r.alive]
        new = [PretendReplica(f"echo-{len(self.replicas) + i}") for i in range(len(old))]
        self.replicas += new
        for r in old:
            r.alive = False
        self.refused_xargs -= set(allow_xargs)
        return [r.name for r in new]

    def _replica(self) -> PretendReplica:
        alive = [r for r in self.replicas if r.alive] or self.replicas
        self._dealt += 1
        return alive[self._dealt % len(alive)]

    def _finish(self, replica: PretendReplica, reason: str) -> None:
        if self.broken and self.fault == "undercount" and replica is self.replicas[0] and self._dealt % 3 == 0:
            return
        replica.finished[reason] = replica.finished.get(reason, 0) + 1

    async def metrics(self, request: web.Request) -> web.Response:
        """The pretend replicas' counters in Ray's export format (what Ray's metrics agent serves under Serve)."""
        if self.broken and self.fault == "scrape_fails":
            return web.Response(status=503, text="metrics agent unavailable (asked for)")
        if self.broken and self.fault == "replica_dies" and len(self.replicas) > 1:
            self.replicas[1].alive = False
        families: dict[str, tuple[str, list[str]]] = {}

        def sample(family: str, kind: str, labels: dict[str, str], value: float) -> None:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            families.setdefault(family, (kind, []))[1].append(f"{family}{{{text}}} {value}")

        for r in self.replicas:
            base = {"ReplicaId": r.name, "engine": "0", "model_name": "fixture"}
            prompt, local, external = r.prompt_tokens, r.prompt_tokens, 0
            if r is self.replicas[0] and self.broken:
                if self.fault == "decreasing_counter":
                    self._drop_at = self._drop_at if self._drop_at is not None else prompt
                    prompt = local = max(0, prompt - self._drop_at - 1)
                elif self.fault == "negative_counter":
                    external, local = -128, local + 128
                elif self.fault == "accounting_violation":
                    r.violations += 1
            if r is self.replicas[0] and self.fault == "sum_mismatch":
                local += 1
            if prompt or r.finished:
                sample("ray_vllm_prompt_tokens_total", "counter", base, prompt)
                for source, v in (("local_compute", local), ("local_cache_hit", 0), ("external_kv_transfer", external)):
                    if v:
                        sample("ray_vllm_prompt_tokens_by_source_total", "counter", base | {"source": source}, v)
                sample("ray_vllm_generation_tokens_total", "counter", base, r.generation_tokens)
            for reason, n in r.finished.items():
                sample("ray_vllm_request_success_total", "counter", base | {"finished_reason": reason}, n)
            if r.violations:
                sample(
                    "ray_vllm_prompt_token_accounting_violations_total",
                    "counter",
                    base | {"kind": "connector_negative"},
                    r.violations,
                )
            if r.alive:
                running = r.running + (1 if self.fault == "stuck" and self.broken and r is self.replicas[0] else 0)
                sample("ray_vllm_num_requests_running", "gauge", base, running)
                sample("ray_vllm_num_requests_waiting", "gauge", base, 0)
            sample(
                HEALTH_GAUGE,
                "gauge",
                {"replica": r.name, "deployment": "LLMServer", "application": "echo"},
                1 if r.alive else 0,
            )
        lines = []
        for family, (kind, samples) in families.items():
            lines += [f"# TYPE {family} {kind}", *samples]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

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
        if self._bodies is not None:
            self._bodies.write(json.dumps({"route": request.path, "body": body}) + "\n")
        chat = request.path.endswith("/chat/completions")
        text = ((body.get("messages") or [{}])[-1] or {}).get("content", "") if chat else body.get("prompt", "")
        behaviour = next((b for b in BEHAVIOURS if b in str(text)), "")
        by = self.stats["by_behaviour"]
        by[behaviour or "normal"] = by.get(behaviour or "normal", 0) + 1
        if behaviour == "!400":
            return _error(400, "vllm_xargs.fuzz_strength must be >= 0", "vllm_xargs.fuzz_strength")
        if behaviour == "!500":
            return _error(500, "internal error (asked for)", None)
        refused = sorted(set(body.get("vllm_xargs") or {}) & self.refused_xargs)
        if refused:
            return _error(400, f"vllm_xargs key {refused[0]!r} is not allowed", f"vllm_xargs.{refused[0]}")
        if self.broken and self.fault == "lost_stream" and body.get("stream") and self.stats["received"] % 5 == 0:
            behaviour = "!truncate"
        replica = self._replica()
        replica.running += 1
        try:
            return await self._generate(request, body, chat, text, behaviour, replica)
        finally:
            replica.running -= 1

    async def _generate(
        self, request: web.Request, body, chat: bool, text, behaviour: str, replica: PretendReplica
    ) -> web.StreamResponse:
        n = int(body.get("max_tokens") or 16)
        replica.prompt_tokens += len(str(text).split())
        itl = 0.1 if behaviour == "!slow" else self.itl_s
        created = int(time.time())
        word = "" if behaviour == "!empty-text" or self.empty_text else " x"
        if not body.get("stream"):
            await asyncio.sleep(self.ttft_s + itl * (n - 1))
            self.stats["completed"] += 1
            replica.generation_tokens += n
            self._finish(replica, "length")
            choice = {"index": 0, "finish_reason": "length"}
            choice.update({"message": {"role": "assistant", "content": word * n}} if chat else {"text": word * n})
            return web.json_response(
                {
                    "id": "echo",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": len(str(text).split()),
                        "completion_tokens": n,
                        "total_tokens": len(str(text).split()) + n,
                    },
                }
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            if chat:  # the speaker's announcement, before any token
                role = {
                    "id": "echo",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
                await resp.write(b"data: " + json.dumps(role).encode() + b"\n\n")
            if self.ttft_s:
                await asyncio.sleep(self.ttft_s)
            for i in range(n):
                if behaviour == "!truncate" and i == n // 2:
                    self._finish(replica, "length")  # the engine finished it; the client never learns
                    await resp.write_eof()  # a well-formed end of the response, but no [DONE]
                    return resp
                if behaviour == "!drop" and i == n // 2:
                    self._finish(replica, "abort")
                    if request.transport is not None:  # None: the connection is already gone
                        request.transport.close()  # the connection drops mid-stream
                    return resp
                if behaviour == "!error-event" and i == n // 2:
                    self._finish(replica, "error")
                    await resp.write(b'data: {"error": {"message": "engine failed (asked for)", "code": 500}}\n\n')
                    return resp
                delta = {"delta": {"content": word}} if chat else {"text": word}
                chunk = {
                    "id": "echo",
                    "created": created,
                    "model": body.get("model"),
                    "choices": [{"index": 0, **delta, "finish_reason": "length" if i == n - 1 else None}],
                }
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                replica.generation_tokens += 1
                if itl and i < n - 1:
                    await asyncio.sleep(itl)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": len(str(text).split()), "completion_tokens": n}
                await resp.write(
                    b"data: " + json.dumps({"id": "echo", "choices": [], "usage": usage}).encode() + b"\n\n"
                )
            await resp.write(b"data: [DONE]\n\n")
            self.stats["completed"] += 1
            self._finish(replica, "length")
        except (ConnectionResetError, asyncio.CancelledError):  # the client went away
            self.stats["disconnected"] += 1
            self._finish(replica, "abort")
        return resp


def _error(status: int, message: str, param: str | None) -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error" if status < 500 else "server_error",
                "param": param,
                "code": status,
            }
        },
        status=status,
    )


async def start(
    port: int = 0, itl_ms: float = 0.0, host: str = "127.0.0.1", **kwargs
) -> tuple[web.AppRunner, EchoServer, int]:
    """Start on the running event loop; returns (runner, server, port). ``await runner.cleanup()`` stops it.

    ``kwargs``: the :class:`EchoServer`'s (``replicas``, ``fault``, ``fault_after``, ``refused_xargs``)."""
    server = EchoServer(itl_ms, **kwargs)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, server, runner.addresses[0][1]


class EchoThread:
    """The echo server on its own event loop in a thread (the CLI runs its own loop in the main thread)."""

    def __init__(self, **kwargs):
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve():
            asyncio.set_event_loop(self.loop)
            self.runner, self.server, self.port = self.loop.run_until_complete(start(**kwargs))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert started.wait(30)

    def close(self):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


def cli_args(port: int, out, extra_metrics: int = 0) -> list[str]:
    """``python -m load_tests`` arguments for a short smoke run against the echo server on ``port`` (its counters
    settle at once, so the monitor's intervals are short); ``extra_metrics``: the endpoint listed that many more
    times (a replica reported twice)."""
    url = f"http://127.0.0.1:{port}"
    return [
        "--scenario",
        "smoke",
        "--url",
        url,
        *["--metrics-url", f"{url}/metrics"] * (1 + extra_metrics),
        "--duration",
        "2",
        "--concurrency",
        "8",
        "--mix",
        '{"bad": 0}',
        "--no-sweep",
        "--no-progress",
        "--scrape-interval",
        "0.3",
        "--settle-interval",
        "0.3",
        "--settle-timeout",
        "3",
        "--out",
        str(out),
    ]


def run_cli(out, extra: Sequence[str] = (), extra_metrics: int = 0, **echo) -> tuple[int, dict]:
    """The stress-test CLI in this process against an echo server (``echo``: its settings, 5 ms between tokens
    unless given), :func:`cli_args` then ``extra``; its exit code and summary.json."""
    from load_tests import cli

    server = EchoThread(**{"itl_ms": 5, **echo})
    try:
        code = cli.main(cli_args(server.port, out, extra_metrics) + list(extra))
    finally:
        server.close()
    return code, json.loads((Path(out) / "summary.json").read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--itl-ms", type=float, default=0.0, help="delay between streamed tokens")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token")
    ap.add_argument("--empty-text", action="store_true", help="every token's text is empty (as !empty-text)")
    ap.add_argument("--replicas", type=int, default=2, help="pretend engine replicas in /metrics")
    ap.add_argument(
        "--fault",
        choices=sorted(FAULTS),
        default=None,
        help="break it on purpose: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )
    ap.add_argument("--fault-after", type=int, default=20, help="requests received before the fault starts")
    ap.add_argument(
        "--record-bodies",
        default=None,
        help="append every request body received to this file (JSON lines: route, body)",
    )
    args = ap.parse_args(argv)

    async def serve() -> None:
        runner, _server, port = await start(
            args.port,
            args.itl_ms,
            args.host,
            replicas=args.replicas,
            fault=args.fault,
            fault_after=args.fault_after,
            ttft_ms=args.ttft_ms,
            empty_text=args.empty_text,
            record_bodies=args.record_bodies,
        )
        print(f"echo server listening on {args.host}:{port}", flush=True)  # --port 0: the port it got
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
