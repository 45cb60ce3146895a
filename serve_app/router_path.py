"""The router path (``ingress: router``): an HTTP ingress deployment, ``ray.serve.llm``'s ``OpenAiIngress`` plus probes.

Not what ``serve_config.yaml`` ships: the direct path (``serve_app.engine.direct_server``)
serves the same API with the same checks at several times less CPU per
request on a small host (docs/benchmarks.md). This path stays for several
models per app, for clusters without Serve's HAProxy, and as a baseline.

Everything OpenAI-shaped (``/v1/completions``, ``/v1/chat/completions``,
streaming, ``/v1/models``, request timeouts, error format) is
``OpenAiIngress``. What this project adds sits around it:

* the checks (API key, body size, ``vllm_xargs`` policy) run in
  :class:`serve_app.ingress.guard.RequestGuard`, installed on the ingress's FastAPI
  app by the builder (``serve_app.app``), before any route parses the body;
* ``GET /health``: liveness, the ingress process answers;
* ``GET /ready``: readiness, every model has a replica whose engine answers
  its health check; 503 naming the model otherwise;
* :func:`openai_http_error`: FastAPI's own errors (unknown model, unknown
  route) in OpenAI's error format instead of ``{"detail": ...}``.

Replicas validate fuzz settings themselves too (the plugin's frontend hook),
so a request that reaches a replica by another path is still checked.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray.serve.llm.ingress import OpenAiIngress
from starlette.exceptions import HTTPException

from serve_app.ingress import probes
from serve_app.ingress.guard import GuardConfig, require_auth
from serve_app.ray_internals import DEFAULT_ENDPOINTS, serve_http_host

log = logging.getLogger("ray.serve.fuzzserve.ingress")


async def error_terminated(chunks: AsyncIterable, request_id: str | None) -> AsyncIterator:
    """Pass a stream's chunks through; if the stream fails midway, end it with an error event and ``[DONE]``.

    Without this, a replica that dies while streaming (SIGKILL, OOM, a dead
    engine) leaves the client with a 200 stream that just stops: no error
    event, no ``[DONE]``, indistinguishable from a network cut (seen in the
    chaos load test: 5 of 93 requests on a killed replica). vLLM's own server
    ends a failed stream the same way: ``data: {"error": ...}`` then
    ``data: [DONE]``. Client disconnects (``CancelledError``) pass through.
    """
    try:
        async for chunk in chunks:
            yield chunk
    except Exception as e:
        log.warning("stream %s failed midway: %s: %s", request_id, type(e).__name__, str(e)[:300])
        error = {
            "message": f"the stream failed midway: {type(e).__name__}: {str(e)[:300]}",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
        yield f"data: {json.dumps({'error': error})}\n\n"
        yield "data: [DONE]\n\n"


class FuzzIngress(OpenAiIngress):
    """The router path's HTTP ingress deployment: ``OpenAiIngress``, streams that fail midway ended with an error
    event, and the probes."""

    def __init__(self, *args, guard: dict[str, Any] | None = None, **kwargs):
        # a deployment that would serve anyone fails at start, naming the fix (serve_app.ingress.guard.require_auth)
        require_auth(GuardConfig.model_validate(guard or {}), serve_http_host())
        super().__init__(*args, **kwargs)

    async def _process_llm_request(self, body, call_method: str, raw_request: Request | None = None):
        response = await super()._process_llm_request(body, call_method, raw_request)
        if isinstance(response, StreamingResponse):
            response.body_iterator = error_terminated(response.body_iterator, getattr(body, "request_id", None))
        return response

    async def health(self) -> JSONResponse:
        return probes.alive()

    async def ready(self) -> JSONResponse:
        models = sorted(self._default_serve_handles)
        errors = await asyncio.gather(
            *(probes.failure(self._default_serve_handles[m].check_health.remote()) for m in models)
        )
        failed = {m: err for m, err in zip(models, errors, strict=True) if err}
        return probes.not_ready(failed) if failed else probes.ready(models)


async def openai_http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """FastAPI's ``{"detail": ...}`` errors (unknown model, unknown route, wrong method) in OpenAI's format."""
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    param = "model" if exc.status_code == 404 and "model" in detail.lower() else None
    return JSONResponse(
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
        content={
            "error": {
                "message": detail,
                "type": "invalid_request_error" if exc.status_code < 500 else "server_error",
                "param": param,
                "code": exc.status_code,
            }
        },
    )


# The routes of OpenAiIngress plus the probes (method name -> route decorator).
ENDPOINTS = {
    **DEFAULT_ENDPOINTS,
    "health": lambda app: app.get("/health"),
    "ready": lambda app: app.get("/ready"),
}
