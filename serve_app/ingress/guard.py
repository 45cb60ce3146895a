"""The guard's checks, as one ASGI middleware: route policy, API key, body size and time, request policy.

Why a middleware and not checks inside the route handlers: it sees the raw
request before anything else parses it, so

* a request vLLM's own request model would reject with a generic message
  (e.g. a dict under ``vllm_xargs.kv_transfer_params``) gets *our* 400 naming
  the field;
* every route the app serves goes through one decision
  (:mod:`serve_app.ingress.route_policy`): a route that is not switched on gets 404
  before the app sees it, including routes a later vLLM adds;
* the same code can sit in front of any ASGI app: the ``OpenAiIngress`` app
  of the ingress deployment (``serve_app.router_path``, ``ingress: router``) or, with Ray's direct
  streaming, vLLM's own app inside an engine replica.

Errors use OpenAI's format (``{"error": {"message", "type", "param",
"code"}}``). Auth is on when the environment variable named by
``GuardConfig.api_keys_env`` holds one or more comma-separated keys; clients
send ``Authorization: Bearer <key>`` as the ``openai`` client does. Keys are
kept and compared as SHA-256 digests, every key every time, so neither a
key's length nor its position in the list shows in the time a refusal
takes. With no keys, a deployment whose HTTP port other hosts can reach
refuses to start unless ``allow_no_auth`` says so (:func:`require_auth`).
docs/security.md has the threat model.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from patches.definitions.fuzz_params import FuzzSpec
from serve_app.ingress.route_policy import DEFAULT_ROUTES, Route, RouteTable
from serve_app.ingress.xargs_policy import (
    RESERVED_HEADERS,
    RequestLimits,
    RequestRejected,
    XargsPolicy,
    check_request_body,
)

log = logging.getLogger("ray.serve.fuzzserve.guard")


class GuardConfig(BaseModel):
    """What the guard enforces. Part of the app's builder arguments (``guard:`` in the YAML)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys_env: str | None = Field(
        default="FUZZSERVE_API_KEYS",
        description="environment variable holding comma-separated API keys; auth is on when it is non-empty",
    )
    allow_no_auth: bool = Field(
        default=False, description="serve without API keys even where other hosts can reach the HTTP port"
    )
    max_body_bytes: int = Field(default=1 << 20, gt=0, description="larger request bodies get 413")
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="a request body not fully received within this many seconds gets 408"
    )
    routes: tuple[str, ...] = Field(
        default=DEFAULT_ROUTES,
        description="the routes served (serve_app/ingress/route_policy.py); every other path gets 404",
    )
    xargs: XargsPolicy = Field(default_factory=XargsPolicy)
    limits: RequestLimits = Field(default_factory=RequestLimits)

    @field_validator("routes")
    @classmethod
    def _known_routes(cls, routes: tuple[str, ...]) -> tuple[str, ...]:
        RouteTable(routes)  # raises naming an unknown or never-served route
        return routes

    def api_keys(self, environ: dict[str, str] | None = None) -> tuple[str, ...]:
        if not self.api_keys_env:
            return ()
        raw = (environ if environ is not None else os.environ).get(self.api_keys_env, "")
        return tuple(k.strip() for k in raw.split(",") if k.strip())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it resolves to whatever the network says
        return False


def require_auth(config: GuardConfig, http_host: str, environ: dict[str, str] | None = None) -> None:
    """Refuse to serve without API keys on an HTTP port other hosts can reach, unless ``allow_no_auth``.

    ``http_host`` is what Serve's HTTP servers bind (``http_options.host``):
    the proxy's and, on the direct path, every engine replica's own port.
    """
    if config.api_keys(environ) or config.allow_no_auth or is_loopback(http_host):
        return
    where = f"the environment variable {config.api_keys_env}" if config.api_keys_env else "guard.api_keys_env"
    raise ValueError(
        f"http_options.host is {http_host!r}: other hosts can reach this deployment, and no API key is "
        f"set. Set {where} (comma-separated keys, in the environment of `ray start` or the app's "
        "runtime_env.env_vars), or bind 127.0.0.1, or accept serving anyone with guard.allow_no_auth: "
        "true"
    )


async def _send_error(send: Send, e: RequestRejected, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(e.body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": e.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


class _Disconnected(Exception):
    pass


class RequestGuard:
    """ASGI middleware applying a :class:`GuardConfig` in front of ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        config: GuardConfig | dict[str, Any] | None = None,
        on_admitted: Callable[[FuzzSpec], None] | None = None,
    ):
        """``on_admitted`` is called with the fuzz settings of every generate request that passes."""
        self.app = app
        self._on_admitted = on_admitted
        self.config = config if isinstance(config, GuardConfig) else GuardConfig.model_validate(config or {})
        self._routes = RouteTable(self.config.routes)
        self._digests = tuple(_digest(k.encode()) for k in self.config.api_keys())
        if not self._digests:
            log.info("fuzz guard: API-key auth is off (%s is empty or unset)", self.config.api_keys_env)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        headers = dict(scope.get("headers") or [])
        try:
            route = self._routes.match(path)
            if route is None:
                raise RequestRejected(f"{path} is not served by this deployment", None, 404, "not_found_error")
            if self._digests and route.policy != "open":
                self._authenticate(headers)
            elif route.policy != "open":
                _require_local_host(headers)
            if route.policy in ("open", "read"):
                _refuse_a_body(headers, path)  # never read: a probe answers at once, whatever a client announces
                await self.app(scope, receive, send)
                return
            if scope.get("method") not in ("POST", "PUT", "PATCH"):
                await self.app(scope, receive, send)
                return
            if route.policy == "checked":
                _refuse_reserved_headers(headers)
            body = await self._read_body(headers, receive)
            if route.policy == "checked":
                body, scope = self._check(body, scope, route)
        except _Disconnected:
            return
        except RequestRejected as e:
            extra = [(b"www-authenticate", b"Bearer")] if e.status_code == 401 else []
            await _send_error(send, e, extra)
            return
        await self.app(scope, _replay(body, receive), send)

    def _authenticate(self, headers: dict[bytes, bytes]) -> None:
        auth = headers.get(b"authorization", b"")
        scheme, _, token = auth.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            raise RequestRejected(
                "missing API key: send the header 'Authorization: Bearer <key>'",
                "Authorization",
                401,
                "authentication_error",
            )
        presented = _digest(token.strip())
        match = False
        for key in self._digests:  # every key, every time: no early exit to time
            match |= hmac.compare_digest(presented, key)
        if not match:
            raise RequestRejected("invalid API key", "Authorization", 401, "authentication_error")

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        too_big = RequestRejected(f"request body exceeds the limit of {limit} bytes", None, 413)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks: list[bytes] = []

        async def read() -> bytes:
            size = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _Disconnected()
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)

        # asyncio.timeout, not wait_for: wait_for runs read() as a task of its own, two more turns of a busy
        # event loop before the request reaches vLLM (docs/benchmarks.md: the request timeline)
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                return await read()
        except TimeoutError:
            raise RequestRejected(
                f"the request body did not arrive within {self.config.body_timeout_s:g} s", None, 408, "timeout_error"
            ) from None

    def _check(self, raw: bytes, scope: Scope, route: Route) -> tuple[bytes, Scope]:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestRejected(f"the request body is not valid JSON: {e}") from None
        except RecursionError:
            raise RequestRejected("the request body is nested too deeply") from None
        body, spec, changed = check_request_body(body, self.config.xargs, self.config.limits, batch=route.batch)
        if self._on_admitted is not None and route.generates:
            self._on_admitted(spec)
        if not changed:
            return raw, scope
        raw = json.dumps(body).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        return raw, {**scope, "headers": headers}


def _require_local_host(headers: dict[bytes, bytes]) -> None:
    """Without API keys (a loopback-only deployment) a request must name a loopback host: a web page whose own
    name an attacker points at 127.0.0.1 (DNS rebinding) makes the browser send its name as Host, and is refused."""
    host = headers.get(b"host", b"").decode("latin-1").strip().lower()
    name = (
        host[1 : host.index("]")]
        if host.startswith("[") and "]" in host
        else host.rsplit(":", 1)[0]
        if host.count(":") == 1
        else host
    )
    if not is_loopback(name):
        raise RequestRejected(
            f"Host {host!r} is not this machine: without API keys this deployment answers only "
            "requests addressed to localhost or a loopback address (set API keys to serve others)",
            "Host",
            403,
            "permission_error",
        )


def _refuse_a_body(headers: dict[bytes, bytes], path: str) -> None:
    """413 for a request that announces a body on a route that takes none (probes, reads): answered before any
    byte of it is read, so a client that announces 1 MiB and withholds it holds no probe for the body deadline."""
    length = headers.get(b"content-length", b"0").strip()
    if b"transfer-encoding" in headers or length not in (b"", b"0"):
        raise RequestRejected(f"{path} takes no request body", None, 413)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _refuse_reserved_headers(headers: dict[bytes, bytes]) -> None:
    for raw in headers:
        name = raw.decode("latin-1").lower().replace("_", "-")
        if name in RESERVED_HEADERS:
            raise RequestRejected(f"the header {name} is reserved for the engine and cannot be set by clients", name)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands out the already-read body once, then defers to the real one.

    Deferring matters for streaming responses: Starlette listens on
    ``receive`` for ``http.disconnect`` to stop a stream when the client goes.
    """
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
