"""The direct path's ingress request router: Ray's ``LLMRouter``, fed a bounded view of the request body.

With several engine replicas, HAProxy asks this deployment (``POST
/internal/route``) which replica takes each request, *before* any replica's
guard has seen the request's API key. So whatever a client sends, the work
done here must be small and must not fail:

* HAProxy forwards at most ``RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE``
  bytes of the body (64 KiB, :mod:`serve_app.engine.cluster_env`; Serve's default is
  8 MiB): a longer body arrives cut, flagged ``X-Body-Truncated``;
* :func:`routing_view` parses those bytes once and keeps only what routing
  reads: the model name, the first ``prefix_chars`` characters of the prompt
  or messages (:func:`serve_app.routing.keys.request_text`), the fuzz keys of
  ``vllm_xargs``. A body that does not parse (cut, not JSON, nested past
  Python's recursion limit) or has the wrong shape becomes an empty view:
  Ray's ``LLMRouter`` then routes on load alone, as it does for a body
  without a prompt;
* ``LLMRouter`` itself (Ray's code, unchanged: replica choice, session and
  LoRA headers, the response HAProxy reads) parses that small view instead of
  the client's body. Unfed, it parses up to 8 MiB per request and answers a
  deeply nested body with a 500 (``RecursionError`` is not among the errors
  it catches), which HAProxy turns into a 503 for that client.

A body cut at 64 KiB loses affinity (its text cannot be read), so a prompt
longer than that is routed on load; its KV is still reused where it lands.

The router replica serves HTTP on a port of its own (``http_options.host``,
30000-31000), which any local process can reach without HAProxy: there the
64 KiB bound is this module's (:func:`bounded_body`): a body declared or
found longer gets 413 before more is read, one that does not arrive within
:data:`ROUTE_BODY_TIMEOUT_S` gets 408. HAProxy's own calls never exceed the
bound (it is the same number), so they are never refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from ray import serve

from patches.definitions.fuzz_params import KEYS as FUZZ_KEYS
from serve_app.ray_internals import LLMRouterBase
from serve_app.routing.keys import DEFAULT_PREFIX_CHARS, request_text

log = logging.getLogger("ray.serve.fuzzserve.ingress_router")

# A model name longer than this is not one this deployment serves.
MAX_MODEL_CHARS = 256
# The most body HAProxy forwards to a router (serve_app.engine.cluster_env sets it for `ray start`): the most a router
# reads from anyone.
ROUTE_BODY_LIMIT = int(os.environ.get("RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE", 64 * 1024))
# HAProxy gives a router call 5 s (RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_TIMEOUT_S): a body slower than that is
# no HAProxy's.
ROUTE_BODY_TIMEOUT_S = 5.0


def routing_view(body: bytes, prefix_chars: int = DEFAULT_PREFIX_CHARS) -> bytes:
    """The JSON body ``LLMRouter`` routes on: model, bounded prompt text, fuzz keys; ``b""`` when unusable."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError, MemoryError):  # cut by HAProxy, not JSON, nested too deep
        return b""
    if not isinstance(data, dict):
        return b""
    view: dict[str, Any] = {}
    model = data.get("model")
    if isinstance(model, str):
        view["model"] = model[:MAX_MODEL_CHARS]
    xargs = data.get("vllm_xargs")
    if isinstance(xargs, dict):
        fuzz = {k: v for k, v in xargs.items() if k in FUZZ_KEYS and isinstance(v, (int, float, str))}
        if fuzz:
            view["vllm_xargs"] = fuzz
    field = "prompt" if data.get("prompt") is not None else "messages"
    text = request_text(_Fields(data), prefix_chars)
    if text:  # the same text the router would read from the full body, as one string it reads the same way
        view[field] = text if field == "prompt" else [{"content": text}]
    return json.dumps(view).encode() if field in view else b""


class _Fields:
    """A dict's keys as attributes, as ``LLMRouter`` hands a body to the request router."""

    def __init__(self, data: dict[str, Any]):
        self.prompt = data.get("prompt")
        self.messages = data.get("messages")


# Defined before the class: serve.ingress cloudpickles the app (and so this
# route's function, by value) while the class statement runs, capturing only
# the module globals that exist at that moment.
def _with_body(request: Request, body: bytes) -> Request:
    """``request`` (its headers: session id, request id, truncation) carrying ``body`` instead of its own."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return Request(request.scope, receive)


async def bounded_body(request: Request, limit: int = ROUTE_BODY_LIMIT) -> bytes | None:
    """The request's body, or None as soon as it is declared or found longer than ``limit`` (nothing more read)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        return None
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            return None
    return bytes(buf)


async def read_route_body(request: Request) -> bytes | JSONResponse:
    """The routing call's body, or the 413 / 408 answer for one too long or too slow."""
    try:  # in this task (asyncio.timeout): wait_for would read in a task of its own, turns of the loop later
        async with asyncio.timeout(ROUTE_BODY_TIMEOUT_S):
            body = await bounded_body(request)
    except TimeoutError:
        return JSONResponse(
            {"detail": f"the routing body did not arrive within {ROUTE_BODY_TIMEOUT_S:g} s"}, status_code=408
        )
    if body is None:
        return JSONResponse({"detail": f"a routing body is at most {ROUTE_BODY_LIMIT} bytes"}, status_code=413)
    return body


router_app = FastAPI()


@serve.ingress(router_app)
class FuzzIngressRouter(LLMRouterBase):
    """``LLMRouter`` (Ray's ingress request router for direct streaming) behind :func:`routing_view`."""

    @router_app.post("/internal/route")
    async def route(self, request: Request):
        body = await read_route_body(request)
        if isinstance(body, JSONResponse):
            return body
        return await LLMRouterBase.route(self, _with_body(request, routing_view(body)))
