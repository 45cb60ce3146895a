"""The edge's bounds on every HTTP listener Serve opens for the app: a request's head arrives within 30 s and within
32 KiB, or the connection gets 408 / 431 and is closed, before any of the app's code runs.

Why: Serve's HAProxy bounds a client's request head (``timeout http-request
30s``, serve_app/ingress/haproxy_edge.sh; its 16 KiB buffer), but the listeners
behind it do not. Each engine replica, each ingress request router and the
fallback proxy run uvicorn (``ray/serve/_private/http_util.py``,
``start_asgi_http_server``) with its ``httptools`` protocol, which arms no
timer before a request's first response and bounds no header: a connection
that sent half a request line stayed open past 45 s, and an 8 MiB header
line was read to the end (measured on the replica's own port; any local
process reaches it, and with ``serve_config.cuda.yaml``'s ``0.0.0.0`` any
host). ASGI middleware cannot help: the app is called only once the head is
complete.

How: uvicorn resolves its default protocol (``http="auto"``, which Ray does
not set) by name when a server starts, from
``uvicorn.protocols.http.auto.AutoHTTPProtocol``. :func:`install` points
that name at :class:`BoundedHttpToolsProtocol`, a subclass of uvicorn's
``HttpToolsProtocol`` that

* arms a timer when a connection opens, and again on the first byte of each
  later request on a kept-alive connection, and cancels it when the
  request's head is complete: at :data:`HEADER_TIMEOUT_S` the client gets
  408 and the connection is closed (HAProxy's ``timeout http-request``,
  nginx's ``client_header_timeout``);
* counts the bytes of the request head: past :data:`MAX_HEADER_BYTES` the
  client gets 431 and the connection is closed (nginx's
  ``large_client_header_buffers``, 4 x 8 KiB; HAProxy's 16 KiB buffer, so
  whatever HAProxy forwards, with the headers it adds, fits).

An idle kept-alive connection between requests stays under uvicorn's own
keep-alive bound, ``http_options.keep_alive_timeout_s`` (30 s in
serve_config.yaml, as HAProxy's; Serve's default 90 s): HAProxy's
server-side pool reuses those connections, and a second timer there could
only race that bound.

:func:`install` runs in each Serve process that starts an HTTP server, from
Serve's HTTP callback (``serve_app.ingress.edge:middlewares``, named by
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` in :mod:`serve_app.engine.cluster_env`),
which Ray calls just before it builds the server's ``uvicorn.Config``. It
refuses, loudly, a uvicorn whose default protocol is not the ``httptools``
one it bounds (``httptools`` missing): the listener would be unbounded.
Imported by Serve's proxy actor: stdlib, uvicorn and httptools only.
"""

from __future__ import annotations

import asyncio
import json
import logging

from uvicorn.protocols.http import auto
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 30.0  # serve_app/ingress/haproxy_edge.sh: timeout http-request 30s
MAX_HEADER_BYTES = 32 * 1024
# After a refusal the connection is half-closed and what the client still sends is read and dropped for at most
# this long before the socket closes (nginx's lingering close): closing a socket with unread input resets it, and
# the reset discards the refusal before the client reads it (seen: an oversized head's 431 lost that way).
LINGER_S = 2.0

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _response(status: int, message: str, param: str) -> bytes:
    """A closing HTTP/1.1 response in the guard's error format (OpenAI's ``{"error": {...}}``)."""
    body = json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": status}}
    ).encode()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (
        status,
        _REASONS[status],
        len(body),
    )
    return head + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol with a deadline and a size bound on each request's head."""

    header_timeout_s = HEADER_TIMEOUT_S
    max_header_bytes = MAX_HEADER_BYTES

    _head_timer: asyncio.TimerHandle | None = None
    _awaiting_head = True
    _head_bytes = 0
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering after a refusal: read and dropped
            return
        if self._awaiting_head:
            if self._head_timer is None:  # the first byte of a later request on a kept-alive connection
                self._arm()
            self._head_bytes += len(data)
        super().data_received(data)  # may complete the head: on_headers_complete
        if self._awaiting_head and self._head_bytes > self.max_header_bytes:
            self._refuse(
                431,
                f"the request line and headers exceed {self.max_header_bytes} bytes",
                "headers",
            )

    def on_headers_complete(self) -> None:
        self._awaiting_head = False
        self._cancel()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._awaiting_head, self._head_bytes = True, 0  # the next request's clock starts at its first byte

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._cancel()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timeout)

    def _cancel(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._awaiting_head:
            self._refuse(
                408,
                f"the request line and headers did not arrive within {self.header_timeout_s:g} s",
                "headers",
            )

    def eof_received(self) -> None:
        if self._refused:  # the client is done sending: the refusal is delivered, close now
            self.transport.close()
        super().eof_received()

    def _refuse(self, status: int, message: str, param: str) -> None:
        self._cancel()
        self._awaiting_head = False
        self._refused = True
        if not self.transport.is_closing():
            self.transport.write(_response(status, message, param))
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the response is all the client gets; then a lingering close
                self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()
        log.warning("listener bounds: %d to %s: %s", status, self.client, message)


def install() -> None:
    """Make every uvicorn server this process starts from now on (with ``http="auto"``) use the bounded protocol.

    Idempotent. Raises where uvicorn's default protocol is not the
    ``httptools`` one this module bounds.
    """
    current = auto.AutoHTTPProtocol
    if current is BoundedHttpToolsProtocol:
        return
    if current is not HttpToolsProtocol:
        raise RuntimeError(
            f"serve_app.ingress.listener_bounds: uvicorn's default HTTP protocol is {current.__module__}."
            f"{current.__qualname__}, not httptools': its listeners would have no header deadline or size bound. "
            "Install httptools (uvicorn[standard]) in the cluster's environment."
        )
    auto.AutoHTTPProtocol = BoundedHttpToolsProtocol
