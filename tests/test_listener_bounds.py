"""The listener bounds (serve_app/ingress/listener_bounds.py) on a real uvicorn server on loopback, raw sockets as
the client.

The server is built the way Ray builds its replicas' and proxy's servers
(``uvicorn.Config`` with the default ``http="auto"``), after
:func:`serve_app.ingress.listener_bounds.install`; the deadline is shortened for the
test (the class attribute), the byte bound is the shipped one. Each refusal
is checked beside the case it must not touch (a complete request, a large
body after a small head, a kept-alive second request). The deployed checks,
on the engine replica's own port, are in tests/test_serve_app.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time

import pytest
import uvicorn
from uvicorn.protocols.http import auto
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serve_app.ingress import listener_bounds
from serve_app.ingress.listener_bounds import MAX_HEADER_BYTES, BoundedHttpToolsProtocol

DEADLINE_S = 0.6


async def _app(scope, receive, send):
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    payload = json.dumps({"bytes": len(body)}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(payload))]})
    await send({"type": "http.response.body", "body": payload})


@contextlib.contextmanager
def _serving(**config_kwargs):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(_app, lifespan="off", log_level="critical", **config_kwargs)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[sock])), daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.02)
    try:
        yield config, sock.getsockname()[1]
    finally:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def server():
    saved = auto.AutoHTTPProtocol
    listener_bounds.install()
    BoundedHttpToolsProtocol.header_timeout_s = DEADLINE_S
    try:
        with _serving() as (config, port):  # http="auto", as Ray leaves it
            assert config.http_protocol_class is BoundedHttpToolsProtocol
            yield port
    finally:
        BoundedHttpToolsProtocol.header_timeout_s = listener_bounds.HEADER_TIMEOUT_S
        auto.AutoHTTPProtocol = saved


def test_without_the_bounds_half_a_request_line_stays_open():
    """The control: uvicorn's own protocol, as Ray ran it, keeps the half-sent request past the deadline."""
    with _serving(http=HttpToolsProtocol) as (_, port), _connect(port) as s:
        s.sendall(b"GET /v1/mod")
        s.settimeout(DEADLINE_S + 1.0)
        with pytest.raises(TimeoutError):
            s.recv(1)


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    return s


def _read_all(s: socket.socket, timeout: float = 10) -> bytes:
    s.settimeout(timeout)
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _json_body(raw: bytes) -> dict:
    return json.loads(raw.split(b"\r\n\r\n", 1)[1])


def test_a_complete_request_is_served(server):
    with _connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        raw = _read_all(s)
    assert _status(raw) == 200


def test_half_a_request_line_gets_408_and_is_closed_within_the_deadline(server):
    with _connect(server) as s:
        started = time.monotonic()
        s.sendall(b"GET /v1/mod")
        raw = _read_all(s)
        took = time.monotonic() - started
    assert _status(raw) == 408, raw
    assert DEADLINE_S <= took < DEADLINE_S + 2
    assert _json_body(raw)["error"]["param"] == "headers"


def test_a_connection_that_sends_nothing_is_closed_within_the_deadline(server):
    with _connect(server) as s:
        started = time.monotonic()
        raw = _read_all(s)
    assert _status(raw) == 408 and time.monotonic() - started < DEADLINE_S + 2


def test_trickled_headers_do_not_reset_the_deadline(server):
    with _connect(server) as s:
        started = time.monotonic()
        s.sendall(b"GET / HTTP/1.1\r\n")
        for i in range(20):  # one header every 0.1 s: more than the deadline in all
            time.sleep(0.1)
            try:
                s.sendall(b"x-%d: y\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                break
        raw = _read_all(s)
    assert _status(raw) == 408 and time.monotonic() - started < DEADLINE_S + 2


def test_an_oversized_header_gets_431_before_it_is_read_to_the_end(server):
    """The client sends an 8 MiB header line piece by piece, as a client that reads its answers does (it stops
    once one is there); the answer is 431 after about the bound, long before the line ends, and it arrives intact
    (the server half-closes and drops what still comes: a plain close would reset the connection and lose it)."""
    import select

    line = b"x-big: " + b"a" * (8 * 1024 * 1024) + b"\r\n"
    with _connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n")
        sent = 0
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for i in range(0, len(line), 65536):
                if select.select([s], [], [], 0.01)[0]:
                    break
                s.sendall(line[i : i + 65536])
                sent += 65536
        raw = _read_all(s)
    assert _status(raw) == 431, raw[:200]
    assert "32768" in _json_body(raw)["error"]["message"]
    assert sent < len(line), "the server closed the connection long before the 8 MiB line was sent"


def test_a_head_just_under_the_bound_is_served(server):
    filler = b"x-fill: " + b"a" * (MAX_HEADER_BYTES - 200) + b"\r\n"
    with _connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + filler + b"\r\n")
        raw = _read_all(s)
    assert _status(raw) == 200


def test_a_large_body_after_a_small_head_is_not_a_header_overflow(server):
    body = b"b" * (1024 * 1024)
    head = b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    with _connect(server) as s:
        s.sendall(head + body)  # one send: the head and the body's start arrive in the same read
        raw = _read_all(s)
    assert _status(raw) == 200 and _json_body(raw) == {"bytes": len(body)}


def test_a_slow_body_is_not_cut_by_the_header_deadline(server):
    with _connect(server) as s:
        s.sendall(b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: 4\r\n\r\nab")
        time.sleep(DEADLINE_S + 0.4)  # the head is complete: the deadline no longer applies (the guard bounds bodies)
        s.sendall(b"cd")
        raw = _read_all(s)
    assert _status(raw) == 200 and _json_body(raw) == {"bytes": 4}


def test_a_kept_alive_connection_gets_the_deadline_for_its_next_request(server):
    with _connect(server) as s:
        s.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        s.settimeout(5)
        first = http.client.HTTPResponse(s)  # reads exactly one response: its head, then content-length bytes
        first.begin()
        assert first.status == 200 and json.loads(first.read()) == {"bytes": 0}
        time.sleep(DEADLINE_S + 0.3)  # idle between requests: Ray's keep-alive bound, not the head deadline
        started = time.monotonic()
        s.sendall(b"GET / HT")  # the next request's head starts, and stops
        raw = _read_all(s)
    assert _status(raw) == 408 and time.monotonic() - started < DEADLINE_S + 2


def test_install_is_idempotent_and_refuses_an_unbounded_default(monkeypatch):
    monkeypatch.setattr(auto, "AutoHTTPProtocol", HttpToolsProtocol)
    listener_bounds.install()
    listener_bounds.install()
    assert auto.AutoHTTPProtocol is BoundedHttpToolsProtocol

    class Other(asyncio.Protocol):
        pass

    monkeypatch.setattr(auto, "AutoHTTPProtocol", Other)
    with pytest.raises(RuntimeError, match="httptools"):
        listener_bounds.install()
