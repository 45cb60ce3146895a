"""The outermost layer of every HTTP server Serve starts: refuse the headers with which a client would change
Ray's own limits, before Ray reads them.

Why not in the guard: Ray Serve reads two request headers *before* it calls
the application, and applies them around it (``ray/serve/_private/replica.py``,
``_direct_ingress_asgi``; the fallback proxy the same in ``proxy.py``):

* ``x-request-timeout-seconds``: the request's timeout; a value <= 0 (or
  ``nan``) disables ``http_options.request_timeout_s`` (300 s shipped);
* ``x-request-disconnect-disabled: ?1``: with the above, Ray awaits the app
  with no deadline at all.

HAProxy forwards both, and the guard (inside the app) runs only after Ray has
acted on them. Ray applies the middlewares that
``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` names outermost, before its
header parsing, in every engine replica, the ingress request router and the
fallback proxy (``ray/serve/_private/http_util.py``, ``_apply_middlewares``):
:func:`middlewares` is that callback (set for ``ray start`` by
:mod:`serve_app.engine.cluster_env`). A request carrying either header, in any
letter case or with ``_`` for ``-``, gets 400 naming it, in the guard's
error format; nothing else is touched. HAProxy's router call never carries
them (its Lua sends only the body, the session and request ids).

The same callback bounds each listener's request heads (a 30 s deadline and
32 KiB, :mod:`serve_app.ingress.listener_bounds`), which no middleware can do: the
app is called only once a head is complete.

Imported by Serve's proxy actor too: stdlib, Starlette and uvicorn only,
besides the guard's error helper.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

# What a client may not send: Ray's own per-request limits (ray/serve/_private/constants.py,
# SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER and SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER).
RAY_CONTROL_HEADERS = ("x-request-timeout-seconds", "x-request-disconnect-disabled")


def _normal(name: bytes) -> str:
    return name.decode("latin-1").lower().replace("_", "-")


class RefuseRayControlHeaders:
    """ASGI middleware: 400 naming the header for a request that sets one of :data:`RAY_CONTROL_HEADERS`."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for name, _ in scope.get("headers") or ():
                normal = _normal(name)
                if normal in RAY_CONTROL_HEADERS:
                    from serve_app.ingress.guard import _send_error
                    from serve_app.ingress.xargs_policy import RequestRejected

                    await _send_error(
                        send,
                        RequestRejected(
                            f"the header {normal} sets the server's own request limits and cannot be sent by clients",
                            normal,
                        ),
                    )
                    return
        await self.app(scope, receive, send)


def middlewares() -> list:
    """Serve's HTTP callback (``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve_app.ingress.edge:middlewares``).

    Ray calls it in each process just before it starts an HTTP server, so it
    also bounds that server's request heads (:mod:`serve_app.ingress.listener_bounds`).
    """
    from starlette.middleware import Middleware

    from serve_app.ingress.listener_bounds import install

    install()
    return [Middleware(RefuseRayControlHeaders)]
