"""A guard in front of an echo app, in-process: the rig for the guard's unit tests.

The echo app serves every kind of route vLLM's OpenAI app has (checked, read, open, refused) and one unknown, and
answers with the path and body it received, so a test sees exactly what the guard let through and how it changed it.
Requests go to ``127.0.0.1`` because the guard refuses a non-loopback ``Host`` when no API key is set.
"""

from __future__ import annotations

import json
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serve_app.ingress.guard import GuardConfig, RequestGuard

APP_PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/chat/completions/batch",
    "/v1/responses",
    "/v1/messages",
    "/invocations",
    "/tokenize",
    "/v1/models",
    "/v1/models/{model:path}",
    "/metrics",
    "/health",
    "/ping",
    "/docs",
    "/openapi.json",
    "/inference/v1/generate",
    "/v1/responses/{rid}",
    "/other",
)
KEYS_ENV = "TEST_GUARD_KEYS"


async def echo(request: Request) -> JSONResponse:
    raw = await request.body()
    return JSONResponse(
        {
            "path": request.url.path,
            "body": json.loads(raw) if raw else None,
            "content_length": request.headers.get("content-length"),
        }
    )


def guarded_client(environ_keys: str = "", on_admitted=None, **config) -> TestClient:
    """A test client for the guard over the echo app; ``environ_keys`` is what the keys variable holds while the
    guard reads it (the process environment is restored after)."""
    inner = Starlette(routes=[Route(p, echo, methods=["GET", "POST"]) for p in APP_PATHS])
    cfg = GuardConfig(api_keys_env=KEYS_ENV, **config)
    old = os.environ.get(KEYS_ENV)
    os.environ[KEYS_ENV] = environ_keys
    try:
        app = RequestGuard(inner, cfg, on_admitted)
    finally:
        if old is None:
            os.environ.pop(KEYS_ENV)
        else:
            os.environ[KEYS_ENV] = old
    return TestClient(app, base_url="http://127.0.0.1:8000")
