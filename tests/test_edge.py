"""Headers a client must not send (issue: headers that reach Ray before the guard).

``serve_app.ingress.edge`` is the middleware Serve applies outermost, before it reads
its own per-request limits from the headers: here in front of an app that
only says it was reached, with a positive control (an ordinary request is
let through, other headers untouched). Deployed, the same middleware is
checked on the real cluster (tests/test_serve_app.py).
"""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from serve_app.ingress.edge import RAY_CONTROL_HEADERS, RefuseRayControlHeaders, middlewares
from testkit.guard_app import guarded_client as client


async def reached(request: Request):
    return JSONResponse({"headers": dict(request.headers)})


EDGE = TestClient(RefuseRayControlHeaders(Starlette(routes=[Route("/{p:path}", reached, methods=["GET", "POST"])])))


@pytest.mark.parametrize(
    "header, value",
    [
        ("x-request-timeout-seconds", "0"),
        ("X-Request-Timeout-Seconds", "-1"),
        ("x_request_timeout_seconds", "nan"),
        ("x-request-timeout-seconds", "1e9"),
        ("x-request-disconnect-disabled", "?1"),
        ("X_REQUEST_DISCONNECT_DISABLED", "?1"),
    ],
)
def test_a_header_that_would_change_rays_limits_gets_400_naming_it(header, value):
    for method, path in (("POST", "/v1/completions"), ("GET", "/health"), ("POST", "/internal/route")):
        r = EDGE.request(method, path, headers={header: value}, json={"model": "m"})
        assert r.status_code == 400, (header, path, r.text)
        error = r.json()["error"]
        assert error["param"] == header.lower().replace("_", "-") and error["param"] in error["message"]


def test_an_ordinary_request_passes_with_its_headers_untouched():
    r = EDGE.post("/v1/completions", headers={"x-request-id": "abc", "authorization": "Bearer k"}, json={})
    assert r.status_code == 200 and r.json()["headers"]["x-request-id"] == "abc"
    assert {h.replace("_", "-") for h in RAY_CONTROL_HEADERS} == set(RAY_CONTROL_HEADERS)


def test_the_callback_returns_what_serve_accepts():
    from ray.serve._private.http_util import validate_http_proxy_callback_return

    assert validate_http_proxy_callback_return(middlewares())[0].cls is RefuseRayControlHeaders


@pytest.mark.parametrize(
    "header, param",
    [
        ("X-Session-ID", "x-session-id"),
        ("x_session_id", "x-session-id"),
        ("X_Session_Id", "x-session-id"),
        ("serve_multiplexed_model_id", "serve-multiplexed-model-id"),
        ("Serve-Multiplexed-Model-Id", "serve-multiplexed-model-id"),
    ],
)
def test_engine_reserved_headers_are_refused_in_every_spelling(header, param):
    r = client().post("/v1/completions", json={"model": "m", "prompt": "p"}, headers={header: "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
