"""Hostile connections: a socket that sends nothing, one that trickles its headers, a stream nobody reads, an
oversized head, a probe that announces a body it never sends. Each reports how long the server took to close it
(or, for the kinds the server must answer, to answer it), never raising.

Raw sockets on purpose (asyncio streams, not an HTTP client): the point is
to behave as no HTTP client library would let one, byte by byte.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from ..plan.hostile import ConnectionKind

TRICKLE = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400  # never ends its headers
TRICKLE_GAP_S = 0.5
READ_POLL_S = 0.5
OVERSIZED_HEAD = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: "
OVERSIZED_BYTES = 1 << 20  # a 1 MiB header line, sent in 64 KiB pieces until the server answers or cuts it
WITHHELD_BODY = b"POST /health HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1048576\r\n\r\n"  # and nothing


@dataclass
class HostileConnection:
    """One hostile connection: when it opened (seconds since the run started), how long until the server closed
    it (None: still open when the attacker gave up, at ``limit_s``), and the first bytes the server sent."""

    kind: ConnectionKind
    t: float
    closed_after_s: float | None  # the answered kinds (plan.hostile.ANSWERED): until the answer's first bytes
    answer: str = ""
    error: str | None = None


async def _wait_closed(
    reader: asyncio.StreamReader, start: float, limit_s: float, writer: asyncio.StreamWriter, trickle: bytes = b""
) -> tuple[float | None, bytes]:
    """Poll until the server closes (EOF or reset), sending ``trickle`` a byte every TRICKLE_GAP_S meanwhile; the
    seconds it took (None past ``limit_s``) and what it sent first."""
    got = b""
    i = 0
    while time.monotonic() - start < limit_s:
        if i < len(trickle):
            try:
                writer.write(trickle[i : i + 1])
                await writer.drain()
            except (ConnectionError, OSError):
                return time.monotonic() - start, got
            i += 1
        try:
            chunk = await asyncio.wait_for(reader.read(65536), TRICKLE_GAP_S if trickle else READ_POLL_S)
        except TimeoutError:
            continue
        except (ConnectionError, OSError):
            return time.monotonic() - start, got
        if not chunk:
            return time.monotonic() - start, got
        got = got or chunk[:200]
    return None, got


async def _first_answer(reader: asyncio.StreamReader, start: float, limit_s: float) -> tuple[float | None, bytes]:
    """Seconds until the server's first bytes (None past ``limit_s``; a close without an answer counts, empty)."""
    try:
        chunk = await asyncio.wait_for(reader.read(65536), max(0.0, limit_s - (time.monotonic() - start)))
    except TimeoutError:
        return None, b""
    except (ConnectionError, OSError):
        chunk = b""
    return time.monotonic() - start, chunk[:200]


async def _oversized(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, start: float, limit_s: float
) -> tuple[float | None, bytes]:
    """The oversized head, piece by piece, until it is all sent, the server cuts it off, or answers; then the
    answer (:func:`_first_answer`, read meanwhile)."""
    answer = asyncio.create_task(_first_answer(reader, start, limit_s))
    writer.write(OVERSIZED_HEAD)
    piece = b"a" * 65536
    for _ in range(OVERSIZED_BYTES // len(piece)):
        if answer.done():
            break
        try:
            writer.write(piece)
            await writer.drain()
        except (ConnectionError, OSError):
            break
    return await answer


async def attack(
    kind: ConnectionKind, base_url: str, t0: float, limit_s: float, api_key: str | None = None, model: str = "fixture"
) -> HostileConnection:
    """Open one hostile connection of ``kind`` to ``base_url`` and wait (at most ``limit_s``) for the server to
    close it. A stalled reader sends a real streamed completion (with the key) and reads nothing for ``limit_s``
    / 2, then drains what the server sent to see whether it closed meanwhile."""
    url = urlparse(base_url)
    t = time.monotonic() - t0
    start = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection(url.hostname, url.port or 80, limit=1 << 20)
    except OSError as e:
        return HostileConnection(kind, t, None, error=f"{type(e).__name__}: {e}"[:200])
    try:
        return await _attack(kind, reader, writer, start, t, limit_s, api_key, model)
    except (ConnectionError, OSError) as e:  # the server cut the request off while it was being sent
        return HostileConnection(kind, t, round(time.monotonic() - start, 2), error=f"{type(e).__name__}: {e}"[:200])
    finally:
        writer.close()


async def _attack(
    kind: ConnectionKind,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    start: float,
    t: float,
    limit_s: float,
    api_key: str | None,
    model: str,
) -> HostileConnection:
    if kind == "idle":
        took, got = await _wait_closed(reader, start, limit_s, writer)
    elif kind in ("trickle", "replica_trickle"):
        took, got = await _wait_closed(reader, start, limit_s, writer, TRICKLE)
    elif kind == "replica_oversized":
        took, got = await _oversized(reader, writer, start, limit_s)
    elif kind == "probe_withheld":
        writer.write(WITHHELD_BODY)
        await writer.drain()
        took, got = await _first_answer(reader, start, limit_s)
    else:
        body = json.dumps(
            {
                "model": model,
                "prompt": "count 1 2",
                "max_tokens": 900,
                "ignore_eos": True,
                "stream": True,
                "temperature": 0,
            }
        ).encode()
        auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + auth
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        await asyncio.sleep(limit_s / 2)  # the reader stalls: nothing read while the server writes
        took, got = await _wait_closed(reader, start, limit_s, writer)  # drains what it buffered, then the close
    return HostileConnection(kind, t, None if took is None else round(took, 2), got.decode(errors="replace"))
