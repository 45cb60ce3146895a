"""What the ingress request router reads of a body it gets before any API key is checked (pure logic).

serve_app/routing/ingress_router.py: Ray's LLMRouter routes on a small view of the
body; serve_app/routing/fuzz_router.py: the request router reads at most the first
``prefix_chars`` characters. Neither may fail on what a client sends.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.routing.fuzz_router import DEFAULT_PREFIX_CHARS, request_text, routing_key
from serve_app.routing.ingress_router import routing_view

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids, max_size=5),
    max_leaves=30,
)


def _pending(body: dict):
    return types.SimpleNamespace(args=[types.SimpleNamespace(**body)])


def test_the_view_routes_like_the_body():
    """The key the request router computes from the view is the key it computes from the full body."""
    long = "count " + " ".join(str(i) for i in range(3000))
    bodies: list[dict[str, Any]] = [
        {"model": "fixture", "prompt": long, "vllm_xargs": {"fuzz_strength": 0.5, "fuzz_mode": "scale"}},
        {"model": "fixture", "prompt": "short"},
        {
            "model": "fixture",
            "messages": [
                {"role": "system", "content": "S" * 300},
                {"role": "user", "content": [{"type": "text", "text": "T" * 400}]},
            ],
            "vllm_xargs": {"fuzz_strength": 2.0, "fuzz_mode": "gaussian", "fuzz_seed": 3},
        },
        {"model": "fixture", "prompt": [1, 2, 3] * 400},
    ]
    for body in bodies:
        view = json.loads(routing_view(json.dumps(body).encode()))
        assert routing_key(_pending(view), DEFAULT_PREFIX_CHARS) == routing_key(_pending(body), DEFAULT_PREFIX_CHARS)
        assert len(json.dumps(view)) < 2 * DEFAULT_PREFIX_CHARS + 300, "only what routing reads"
        assert view["model"] == "fixture"


def test_big_bodies_give_a_small_view():
    body = json.dumps({"model": "m", "prompt": "x" * (8 << 20), "max_tokens": 5}).encode()
    view = routing_view(body)
    assert json.loads(view) == {"model": "m", "prompt": "x" * DEFAULT_PREFIX_CHARS}
    messages = [{"role": "user", "content": "y" * 1000}] * 10_000  # ~10 MB of messages
    view = json.loads(routing_view(json.dumps({"messages": messages}).encode()))
    assert view == {"messages": [{"content": "y" * DEFAULT_PREFIX_CHARS}]}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"prompt": "cut by HAProxy',
        b"[" * 100_000,
        b'{"a":' * 50_000,
        b"\xff\xfe",
        b"null",
        b"[1, 2]",
        b'"just a string"',
        json.dumps({"messages": 1}).encode(),
        json.dumps({"messages": {"a": 1}}).encode(),
        json.dumps({"prompt": None, "messages": None}).encode(),
        json.dumps({"model": 5, "prompt": ""}).encode(),
    ],
)
def test_unusable_bodies_give_an_empty_view_and_never_raise(body):
    """Cut, not JSON, nested past the recursion limit, wrong types: LLMRouter gets nothing and routes on load."""
    assert routing_view(body) == b""


def test_xargs_keep_only_fuzz_keys():
    view = json.loads(
        routing_view(
            json.dumps(
                {
                    "prompt": "p",
                    "vllm_xargs": {
                        "fuzz_strength": 1,
                        "kv_transfer_params": {"x": 1},
                        "fuzz_mode": ["bad"],
                        "other": "y",
                    },
                }
            ).encode()
        )
    )
    assert view == {"prompt": "p", "vllm_xargs": {"fuzz_strength": 1}}


@settings(max_examples=300, deadline=None)
@given(prompt=json_values, messages=json_values)
def test_request_text_is_bounded_and_never_raises(prompt, messages):
    request = types.SimpleNamespace(prompt=prompt, messages=messages)
    text = request_text(request, 50)
    assert text is None or (isinstance(text, str) and len(text) <= 50)
    assert routing_view(json.dumps({"prompt": prompt, "messages": messages}).encode()) is not None


def test_request_text_stops_reading_at_the_limit():
    class Guarded(list):
        """Messages that fail the test if read past the third."""

        def __iter__(self):
            for i, m in enumerate(list.__iter__(self)):
                assert i < 3, "read past the limit"
                yield m

    # request_text swallows errors (returning None), so reading too far shows as a wrong result
    assert request_text(types.SimpleNamespace(messages=Guarded([{"content": "ab"}] * 10)), 5) == "ababa"
    deep: list = ["deep"]
    for _ in range(10_000):
        deep = [deep]
    assert request_text(types.SimpleNamespace(prompt=deep), 10) == ""  # past MAX_TEXT_DEPTH: no text, no crash


def test_the_route_serve_freezes_can_resolve_every_name_it_uses():
    """serve.ingress cloudpickles the app while the class statement runs: a helper defined after the class is
    missing from the frozen route's globals, and the router answers 500 (NameError) to every request (seen:
    the first deploy of this module). Check the copy Serve keeps, not the module's own function."""
    import builtins

    from fastapi import FastAPI
    from starlette.routing import Route

    from serve_app.routing.ingress_router import FuzzIngressRouter

    frozen = [
        c.cell_contents for c in FuzzIngressRouter.__init__.__closure__ or () if isinstance(c.cell_contents, FastAPI)
    ]
    assert frozen, "Serve's ingress wrapper keeps the frozen app in its __init__'s closure"
    [route] = [r for r in frozen[0].routes if getattr(r, "path", None) == "/internal/route"]
    assert isinstance(route, Route)  # a route with an endpoint (FastAPI's APIRoute is one)
    fn = route.endpoint
    missing = [
        n
        for n in fn.__code__.co_names
        if n not in fn.__globals__ and not hasattr(builtins, n) and n not in ("body", "route")
    ]  # attribute names (request.body(), LLMRouterBase.route)
    assert not missing, f"names the frozen route cannot resolve: {missing}"


def _route_app():
    """The router's body handling in front of an app that echoes what it got (the real route is a Serve method)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from serve_app.routing.ingress_router import read_route_body

    async def route(request):
        body = await read_route_body(request)
        return body if not isinstance(body, bytes) else JSONResponse({"bytes": len(body)})

    return Starlette(routes=[Route("/internal/route", route, methods=["POST"])])


def test_the_routers_own_port_refuses_a_body_over_the_bound_before_reading_it():
    from starlette.testclient import TestClient

    from serve_app.routing.ingress_router import ROUTE_BODY_LIMIT

    c = TestClient(_route_app())
    assert c.post("/internal/route", content=b"x" * ROUTE_BODY_LIMIT).json() == {"bytes": ROUTE_BODY_LIMIT}
    r = c.post("/internal/route", content=b"x" * (ROUTE_BODY_LIMIT + 1))
    assert r.status_code == 413 and str(ROUTE_BODY_LIMIT) in r.json()["detail"]
    # declared too long: refused on the header alone
    r = c.post("/internal/route", content=b"{}", headers={"content-length": str(10 * ROUTE_BODY_LIMIT)})
    assert r.status_code == 413


def test_a_streamed_body_is_cut_off_at_the_bound_without_reading_the_rest():
    import asyncio

    from starlette.requests import Request

    from serve_app.routing.ingress_router import bounded_body

    sent = []

    async def receive():  # an endless chunked body: 4 KiB per message
        sent.append(1)
        return {"type": "http.request", "body": b"x" * 4096, "more_body": True}

    scope = {"type": "http", "method": "POST", "path": "/internal/route", "headers": []}
    assert asyncio.run(bounded_body(Request(scope, receive), limit=64 * 1024)) is None
    assert len(sent) == 17, "stopped at the first chunk past the bound"


def test_a_body_that_never_arrives_gets_408(monkeypatch):
    import asyncio

    from starlette.requests import Request

    import serve_app.routing.ingress_router as ir

    monkeypatch.setattr(ir, "ROUTE_BODY_TIMEOUT_S", 0.2)

    async def receive():
        await asyncio.sleep(10)

    scope = {"type": "http", "method": "POST", "path": "/internal/route", "headers": []}
    r = asyncio.run(ir.read_route_body(Request(scope, receive)))
    assert not isinstance(r, bytes) and r.status_code == 408
