"""What the guard costs one request on the headline's cold workload, in-process: no HTTP, no engine, no Ray.

    python -m benchmarks.investigations.guard_cost [--requests 20000] [--blocks 6]
        [--out docs/benchmarks/guard_cost.json]

The headline benchmark measures the Serve path as a whole (the shipped stack
against the same engine behind vLLM's server), and with ``via=replica``
without HAProxy's hop; what is left is the engine replica's frontend: Ray's
direct-ingress HTTP server, the guard, ``ray.serve.llm``'s app around vLLM's.
This isolates the guard's share of it: the request vLLM's ``bench serve``
sends in the headline (a streamed completion of a 128-token prompt of
vocabulary words, ``ignore_eos``, greedy) through :class:`RequestGuard`
configured as ``serve_config.yaml`` configures it, in front of an ASGI app
that reads the body and answers one chunk, against that app alone. Blocks
alternate (guard, bare, bare, guard, ...); each block's figure is the median
over its requests of the wall time of one ``app(scope, receive, send)``
call; the result is the median over blocks of (guard - bare), in
microseconds.

What it leaves out: the guard's ``on_admitted`` hook (in a replica, one
increment of a Ray Serve counter, :mod:`serve_app.observability.fuzz_traffic`; a no-op
here, since it needs a Ray worker), and anything that depends on the event
loop being shared with vLLM's output handling. Read it as the guard's own
CPU on the request's critical path, not as a latency under load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from load_tests.command_logs import command_logging

log = logging.getLogger("fuzzserve.benchmarks.guard_cost")

REPO = Path(__file__).resolve().parents[2]


def bench_body(words: int = 127) -> bytes:
    """The body vLLM's ``bench serve`` (openai backend) sends in the headline's cold runs, prompt included."""
    prompt = " ".join(f"w{i % 97}" for i in range(words))
    return json.dumps(
        {
            "model": "fixture",
            "prompt": prompt,
            "temperature": 0.0,
            "repetition_penalty": 1.0,
            "max_tokens": 64,
            "logprobs": None,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
    ).encode()


async def answer_one_chunk(scope: dict[str, Any], receive, send) -> None:
    """The bare app: drain the body, start a stream, send one chunk and the end."""
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def scope_for(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    }


async def time_block(app, body: bytes, n: int) -> float:
    """Median wall time of one request through ``app``, in microseconds, over ``n`` requests."""
    times: list[float] = []
    for _ in range(n):
        scope = scope_for(body)
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any], sent: list[dict[str, Any]] = sent) -> None:
            sent.append(message)

        t0 = time.perf_counter_ns()
        await app(scope, receive, send)
        times.append((time.perf_counter_ns() - t0) / 1000)
        if sent[0].get("status") != 200:
            raise RuntimeError(f"the guard refused the benchmark's request: {sent}")
    return statistics.median(times)


def guarded(app):
    from benchmarks.harness.arms import load_config
    from serve_app.config import deploy_config
    from serve_app.ingress.guard import RequestGuard

    guard = deploy_config.application(load_config(REPO / "serve_config.yaml")).fuzz_args.guard
    return RequestGuard(app, guard, on_admitted=lambda spec: None)


def measure(requests: int, blocks: int) -> dict[str, Any]:
    body = bench_body()
    guard = guarded(answer_one_chunk)
    order = [("guard", "bare") if b % 2 == 0 else ("bare", "guard") for b in range(blocks)]
    per_block: list[dict[str, float]] = []

    async def run() -> None:
        await time_block(guard, body, 200)  # warm-up: imports, pydantic's first validations
        await time_block(answer_one_chunk, body, 200)
        for pair in order:
            per_block.append(
                {
                    name: await time_block(guard if name == "guard" else answer_one_chunk, body, requests)
                    for name in pair
                }
            )

    asyncio.run(run())
    extra = [b["guard"] - b["bare"] for b in per_block]
    return {
        "requests_per_block": requests,
        "blocks": blocks,
        "body_bytes": len(body),
        "per_block_us": per_block,
        "guard_minus_bare_us": extra,
        "median_us": statistics.median(extra),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20000, help="requests per block and arm")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    command_logging()
    result = {
        "command": "python -m benchmarks.investigations.guard_cost "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **measure(args.requests, args.blocks),
    }
    log.info(
        "the guard adds %.1f us per request (median over %d blocks of %d requests; blocks: %s)",
        result["median_us"],
        args.blocks,
        args.requests,
        ", ".join(f"{x:.1f}" for x in result["guard_minus_bare_us"]),
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
