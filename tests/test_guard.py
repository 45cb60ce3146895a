"""The guard (ASGI middleware) in front of a plain echo app: auth, size limit, request policy.

Pure logic: the app behind the guard only echoes what reached it, so each
test shows what the guard let through, changed or refused. The same guard
runs in front of the real ingress in tests/test_serve_app.py.
"""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from patches.fuzz_params import MAX_STRENGTH, FuzzSpec
from serve_app.fuzz_traffic import labels
from serve_app.guard import GuardConfig, RequestGuard


async def echo(request: Request):
    raw = await request.body()
    return JSONResponse({"path": request.url.path, "body": json.loads(raw) if raw else None,
                         "content_length": request.headers.get("content-length")})


def client(environ_keys: str = "", on_admitted=None, **config) -> TestClient:
    inner = Starlette(routes=[Route(p, echo, methods=["GET", "POST"])
                              for p in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/other")])
    cfg = GuardConfig(api_keys_env="TEST_GUARD_KEYS", **config)
    import os

    old = os.environ.get("TEST_GUARD_KEYS")
    os.environ["TEST_GUARD_KEYS"] = environ_keys
    try:
        app = RequestGuard(inner, cfg, on_admitted)
    finally:
        if old is None:
            os.environ.pop("TEST_GUARD_KEYS")
        else:
            os.environ["TEST_GUARD_KEYS"] = old
    return TestClient(app)


def test_valid_fuzz_request_passes_unchanged():
    body = {"model": "m", "prompt": "p", "vllm_xargs": {"fuzz_strength": 0.5, "fuzz_mode": "gaussian", "fuzz_seed": 3}}
    r = client().post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["body"] == body


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("xargs, param", [
    ({"fuzz_strength": -1}, "vllm_xargs.fuzz_strength"),
    ({"fuzz_strength": "x"}, "vllm_xargs.fuzz_strength"),
    ({"fuzz_mode": "other", "fuzz_strength": 1}, "vllm_xargs.fuzz_mode"),
    ({"fuzz_seed": 1.5, "fuzz_strength": 1}, "vllm_xargs.fuzz_seed"),
    ({"kv_transfer_params": {"do_remote_prefill": True}}, "vllm_xargs.kv_transfer_params"),
    ({"session_id": "s"}, "vllm_xargs.session_id"),
    ({"unknown": 1}, "vllm_xargs.unknown"),
])
def test_bad_xargs_get_400_naming_the_field(route, xargs, param):
    r = client().post(route, json={"model": "m", "prompt": "p", "messages": [], "vllm_xargs": xargs})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == 400 and err["type"] == "invalid_request_error"
    assert param.split(".")[-1] in err["message"]


def test_admitted_requests_are_counted_by_fuzz_setting_and_refused_ones_are_not():
    seen = []
    c = client("k1", on_admitted=seen.append)
    auth = {"Authorization": "Bearer k1"}
    c.post("/v1/completions", json={"prompt": "p"}, headers=auth)
    c.post("/v1/chat/completions", json={"messages": [], "vllm_xargs": {"fuzz_strength": 0.003}}, headers=auth)
    c.post("/v1/completions", json={"prompt": "p", "vllm_xargs": {"fuzz_strength": 5, "fuzz_mode": "gaussian"}},
           headers=auth)
    assert [labels(s) for s in seen] == [{"fuzz_mode": "none", "fuzz_strength": "0"},
                                         {"fuzz_mode": "scale", "fuzz_strength": "1e-02"},
                                         {"fuzz_mode": "gaussian", "fuzz_strength": "1e+01"}]
    # refused (bad field, no key, too big) or unchecked (other route): not counted
    assert c.post("/v1/completions", json={"vllm_xargs": {"fuzz_strength": -1}}, headers=auth).status_code == 400
    assert c.post("/v1/completions", json={"prompt": "p"}).status_code == 401
    assert c.post("/other", json={"prompt": "p"}, headers=auth).status_code == 200
    assert len(seen) == 3


@pytest.mark.parametrize("strength, bound", [(1e-9, "1e-04"), (1e-4, "1e-04"), (1.0001e-4, "1e-03"), (0.5, "1e+00"),
                                             (1.0, "1e+00"), (999.0, "1e+03"), (MAX_STRENGTH, "1e+03")])
def test_strength_label_is_the_decade_bound_at_or_above(strength, bound):
    assert labels(FuzzSpec(strength=strength, mode="gaussian")) == {"fuzz_mode": "gaussian", "fuzz_strength": bound}


def test_top_level_kv_transfer_params_refused_or_stripped():
    body = {"model": "m", "prompt": "p", "kv_transfer_params": {"remote_block_ids": [1]}}
    r = client().post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
    r = client(xargs={"reserved": "strip"}).post(
        "/v1/completions", json={**body, "vllm_xargs": {"fuzz_strength": 1, "ec_transfer_params": 1}})
    assert r.status_code == 200
    forwarded = r.json()
    assert forwarded["body"] == {"model": "m", "prompt": "p", "vllm_xargs": {"fuzz_strength": 1}}
    assert int(forwarded["content_length"]) == len(json.dumps(forwarded["body"]).encode())


def test_not_json_and_not_an_object():
    c = client()
    r = c.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = c.post("/v1/completions", json=[1, 2])
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]


def test_body_size_limit():
    c = client(max_body_bytes=100)
    r = c.post("/v1/completions", json={"model": "m", "prompt": "x" * 200})
    assert r.status_code == 413 and "100 bytes" in r.json()["error"]["message"]
    # a chunked body (no content-length) is counted as it arrives
    r = c.post("/other", content=iter([b"a" * 60, b"b" * 60]))
    assert r.status_code == 413
    assert c.post("/v1/completions", json={"model": "m", "prompt": "ok"}).status_code == 200


def test_api_keys():
    c = client("k1, k2")
    body = {"model": "m", "prompt": "p"}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.headers["www-authenticate"] == "Bearer"
    assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    assert c.post("/v1/completions", json=body, headers={"Authorization": "Basic k1"}).status_code == 401
    assert c.post("/v1/completions", json=body, headers={"Authorization": "Bearer k2"}).status_code == 200
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer k1"}).status_code == 200
    assert c.get("/health").status_code == 200, "probes need no key"
    # auth is checked before the body: a bad key never learns about field rules
    r = c.post("/v1/completions", json={"vllm_xargs": {"fuzz_strength": -1}})
    assert r.status_code == 401


def test_no_keys_means_auth_off():
    assert client("").post("/v1/completions", json={"model": "m"}).status_code == 200
    assert client(" , ").post("/v1/completions", json={"model": "m"}).status_code == 200


def test_other_routes_and_methods_pass():
    c = client()
    assert c.get("/v1/models").status_code == 200
    r = c.post("/other", json={"vllm_xargs": {"fuzz_strength": -1}})
    assert r.status_code == 200, "only completions/chat bodies are checked"


def test_config_is_strict():
    with pytest.raises(ValueError):
        GuardConfig(max_body_bytes=0)
    with pytest.raises(ValueError):
        GuardConfig.model_validate({"api_key": "x"})


def test_a_stream_that_fails_midway_ends_with_an_error_event():
    import asyncio

    from serve_app.ingress import error_terminated

    async def dying():
        yield 'data: {"choices": [{"text": " 4"}]}\n\n'
        raise RuntimeError("ActorDiedError: the replica died")

    async def healthy():
        yield "data: 1\n\n"
        yield "data: [DONE]\n\n"

    async def collect(gen):
        return [c async for c in error_terminated(gen, "req-1")]

    out = asyncio.run(collect(dying()))
    assert out[0].startswith('data: {"choices"') and out[-1] == "data: [DONE]\n\n"
    err = json.loads(out[1][len("data: "):])["error"]
    assert err["code"] == 500 and "ActorDiedError" in err["message"]
    assert asyncio.run(collect(healthy())) == ["data: 1\n\n", "data: [DONE]\n\n"]
