"""The fuzz router's checks, as one ASGI middleware: API key, body size, request policy.

Why a middleware and not checks inside the route handlers: it sees the raw
request before anything else parses it, so

* a request vLLM's own request model would reject with a generic message
  (e.g. a dict under ``vllm_xargs.kv_transfer_params``) gets *our* 400 naming
  the field;
* auth and size limits cover every route the same way, including ones the
  app gains later;
* the same code can sit in front of any ASGI app: the ``OpenAiIngress`` app
  of the ingress deployment (``serve_app.ingress``, ``ingress: router``) or, with Ray's direct
  streaming, vLLM's own app inside an engine replica.

Errors use OpenAI's format (``{"error": {"message", "type", "param",
"code"}}``). Auth is on when the environment variable named by
``GuardConfig.api_keys_env`` holds one or more comma-separated keys; clients
send ``Authorization: Bearer <key>`` as the ``openai`` client does.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from patches.fuzz_params import FuzzSpec

from .xargs_policy import XargsPolicy, RequestRejected, check_request_body

log = logging.getLogger("ray.serve.fuzzserve.guard")

# Routes whose JSON body carries vllm_xargs and is checked.
CHECKED_ROUTES = ("/v1/completions", "/v1/chat/completions")
# Routes answered without an API key (liveness/readiness probes).
OPEN_ROUTES = ("/health", "/ready", "/ping")


class GuardConfig(BaseModel):
    """What the guard enforces. Part of the app's builder arguments (``guard:`` in the YAML)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys_env: str | None = Field(
        default="FUZZSERVE_API_KEYS",
        description="environment variable holding comma-separated API keys; auth is on when it is non-empty",
    )
    max_body_bytes: int = Field(default=1 << 20, gt=0, description="larger request bodies get 413")
    xargs: XargsPolicy = Field(default_factory=XargsPolicy)

    def api_keys(self, environ: dict[str, str] | None = None) -> tuple[str, ...]:
        if not self.api_keys_env:
            return ()
        raw = (environ if environ is not None else os.environ).get(self.api_keys_env, "")
        return tuple(k.strip() for k in raw.split(",") if k.strip())


async def _send_error(send: Send, e: RequestRejected, headers: list[tuple[bytes, bytes]] = ()) -> None:
    payload = json.dumps(e.body()).encode()
    await send({"type": "http.response.start", "status": e.status_code,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode()), *headers]})
    await send({"type": "http.response.body", "body": payload})


class _Disconnected(Exception):
    pass


class RequestGuard:
    """ASGI middleware applying a :class:`GuardConfig` in front of ``app``."""

    def __init__(self, app: ASGIApp, config: GuardConfig | dict[str, Any] | None = None,
                 on_admitted: Callable[[FuzzSpec], None] | None = None):
        """``on_admitted`` is called with the fuzz settings of every checked request that passes."""
        self.app = app
        self._on_admitted = on_admitted
        self.config = config if isinstance(config, GuardConfig) else GuardConfig.model_validate(config or {})
        self._keys = tuple(k.encode() for k in self.config.api_keys())
        if not self._keys:
            log.info("fuzz router: API-key auth is off (%s is empty or unset)", self.config.api_keys_env)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        headers = dict(scope.get("headers") or [])
        try:
            if self._keys and path not in OPEN_ROUTES:
                self._authenticate(headers)
            if scope.get("method") not in ("POST", "PUT", "PATCH"):
                await self.app(scope, receive, send)
                return
            body = await self._read_body(headers, receive)
            if path in CHECKED_ROUTES:
                body, scope = self._check(body, scope)
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
            raise RequestRejected("missing API key: send the header 'Authorization: Bearer <key>'",
                                  "Authorization", 401, "authentication_error")
        token = token.strip()
        # compare against every key, in constant time per key
        if not any(hmac.compare_digest(token, k) for k in self._keys):
            raise RequestRejected("invalid API key", "Authorization", 401, "authentication_error")

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        limit = self.config.max_body_bytes
        too_big = RequestRejected(f"request body exceeds the limit of {limit} bytes", None, 413)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_big
        chunks, size = [], 0
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

    def _check(self, raw: bytes, scope: Scope) -> tuple[bytes, Scope]:
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise RequestRejected(f"the request body is not valid JSON: {e}") from None
        body, spec, changed = check_request_body(body, self.config.xargs)
        if self._on_admitted is not None:
            self._on_admitted(spec)
        if not changed:
            return raw, scope
        raw = json.dumps(body).encode()
        headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        return raw, {**scope, "headers": headers}


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
