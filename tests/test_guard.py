"""The guard (ASGI middleware) in front of a plain echo app: auth, size limit, request policy.

Pure logic: the app behind the guard only echoes what reached it, so each
test shows what the guard let through, changed or refused. The same guard
runs in front of the real ingress in tests/test_serve_app.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from patches.definitions.fuzz_params import MAX_STRENGTH, FuzzSpec
from serve_app.ingress.guard import GuardConfig, RequestGuard
from serve_app.ingress.route_policy import DEFAULT_ROUTES
from serve_app.observability.fuzz_traffic import labels
from testkit.guard_app import echo
from testkit.guard_app import guarded_client as client


def test_valid_fuzz_request_passes_unchanged():
    body = {"model": "m", "prompt": "p", "vllm_xargs": {"fuzz_strength": 0.5, "fuzz_mode": "gaussian", "fuzz_seed": 3}}
    r = client().post("/v1/completions", json=body)
    assert r.status_code == 200 and r.json()["body"] == body


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "xargs, param",
    [
        ({"fuzz_strength": -1}, "vllm_xargs.fuzz_strength"),
        ({"fuzz_strength": "x"}, "vllm_xargs.fuzz_strength"),
        ({"fuzz_mode": "other", "fuzz_strength": 1}, "vllm_xargs.fuzz_mode"),
        ({"fuzz_seed": 1.5, "fuzz_strength": 1}, "vllm_xargs.fuzz_seed"),
        ({"kv_transfer_params": {"do_remote_prefill": True}}, "vllm_xargs.kv_transfer_params"),
        ({"session_id": "s"}, "vllm_xargs.session_id"),
        ({"unknown": 1}, "vllm_xargs.unknown"),
    ],
)
def test_bad_xargs_get_400_naming_the_field(route, xargs, param):
    r = client().post(route, json={"model": "m", "prompt": "p", "messages": [], "vllm_xargs": xargs})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == 400 and err["type"] == "invalid_request_error"
    assert param.split(".")[-1] in err["message"]


def test_admitted_requests_are_counted_by_fuzz_setting_and_refused_ones_are_not():
    seen: list[FuzzSpec] = []
    c = client("k1", on_admitted=seen.append)
    auth = {"Authorization": "Bearer k1"}
    c.post("/v1/completions", json={"prompt": "p"}, headers=auth)
    c.post("/v1/chat/completions", json={"messages": [], "vllm_xargs": {"fuzz_strength": 0.003}}, headers=auth)
    c.post(
        "/v1/completions",
        json={"prompt": "p", "vllm_xargs": {"fuzz_strength": 5, "fuzz_mode": "gaussian"}},
        headers=auth,
    )
    assert [labels(s) for s in seen] == [
        {"fuzz_mode": "none", "fuzz_strength": "0"},
        {"fuzz_mode": "scale", "fuzz_strength": "1e-02"},
        {"fuzz_mode": "gaussian", "fuzz_strength": "1e+01"},
    ]
    # refused (bad field, no key, route not served) or not a generate request (tokenize): not counted
    assert c.post("/v1/completions", json={"vllm_xargs": {"fuzz_strength": -1}}, headers=auth).status_code == 400
    assert c.post("/v1/completions", json={"prompt": "p"}).status_code == 401
    assert c.post("/other", json={"prompt": "p"}, headers=auth).status_code == 404
    big = client("k1", on_admitted=seen.append, routes=(*DEFAULT_ROUTES, "/tokenize"))
    assert big.post("/tokenize", json={"prompt": "p"}, headers=auth).status_code == 200
    assert len(seen) == 3


@pytest.mark.parametrize(
    "strength, bound",
    [
        (1e-9, "1e-04"),
        (1e-4, "1e-04"),
        (1.0001e-4, "1e-03"),
        (0.5, "1e+00"),
        (1.0, "1e+00"),
        (999.0, "1e+03"),
        (MAX_STRENGTH, "1e+03"),
    ],
)
def test_strength_label_is_the_decade_bound_at_or_above(strength, bound):
    assert labels(FuzzSpec(strength=strength, mode="gaussian")) == {"fuzz_mode": "gaussian", "fuzz_strength": bound}


def test_top_level_kv_transfer_params_refused_or_stripped():
    body = {"model": "m", "prompt": "p", "kv_transfer_params": {"remote_block_ids": [1]}}
    r = client().post("/v1/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kv_transfer_params"
    r = client(xargs={"reserved": "strip"}).post(
        "/v1/completions", json={**body, "vllm_xargs": {"fuzz_strength": 1, "ec_transfer_params": 1}}
    )
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
    # a chunked body (no content-length) is counted as it arrives, on every route that takes one
    r = c.post("/v1/completions", content=iter([b"a" * 60, b"b" * 60]))
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


def test_only_switched_on_routes_are_served():
    c = client()
    for path in ("/v1/models", "/v1/models/fixture", "/metrics", "/health", "/ping"):
        assert c.get(path).status_code == 200, path
    # unknown, refused, or known but not switched on: 404 from the guard, whatever the app would answer
    for path in (
        "/other",
        "/docs",
        "/openapi.json",
        "/inference/v1/generate",
        "/v1/responses/abc",
        "/v1/chat/completions/batch",
        "/v1/responses",
        "/v1/messages",
        "/invocations",
        "/tokenize",
    ):
        r = c.post(path, json={"prompt": "p"})
        assert r.status_code == 404, path
        assert r.json()["error"]["type"] == "not_found_error" and path in r.json()["error"]["message"]
        assert c.get(path).status_code == 404, path
    # a probe or read route takes no body: one announced gets 413 at once (never read, never checked); none, the app
    r = c.post("/ping", json={"vllm_xargs": {"fuzz_strength": -1}})
    assert r.status_code == 413 and "takes no request body" in r.json()["error"]["message"]
    assert c.post("/ping").status_code == 200


@pytest.mark.parametrize("path", ["/health", "/ping", "/v1/models", "/metrics"])
@pytest.mark.parametrize("announce", [[(b"content-length", b"1048576")], [(b"transfer-encoding", b"chunked")]])
def test_a_body_announced_and_withheld_on_a_probe_or_read_route_is_answered_at_once(path, announce):
    """The body never comes; the guard must answer without waiting for it (its body deadline is 30 s)."""
    # echo is an endpoint, not an ASGI app: never reached here, the guard answers before any app would be called
    app = RequestGuard(echo, {"api_keys_env": "NO_SUCH_ENV"})  # type: ignore[arg-type]
    sent: list[dict] = []

    async def receive():
        await asyncio.sleep(3600)  # the withheld body

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"host", b"localhost"), *announce]}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 2))
    assert sent[0]["status"] == 413


GENERATE_ROUTES = ("/v1/chat/completions/batch", "/v1/responses", "/v1/messages", "/invocations")


@pytest.mark.parametrize("route", GENERATE_ROUTES)
@pytest.mark.parametrize(
    "body, param",
    [
        ({"kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
        ({"vllm_xargs": {"kv_transfer_params": {"do_remote_prefill": True}}}, "vllm_xargs.kv_transfer_params"),
        ({"vllm_xargs": {"kv_load_tiers": ["cpu"]}}, "vllm_xargs.kv_load_tiers"),
        ({"session_id": "s1"}, "session_id"),
        ({"vllm_xargs": {"fuzz_strength": -1}}, "vllm_xargs.fuzz_strength"),
        ({"n": 9}, "n"),
    ],
)
def test_every_generate_route_gets_the_same_policy_once_switched_on(route, body, param):
    c = client(routes=(*DEFAULT_ROUTES, *GENERATE_ROUTES))
    r = c.post(route, json={"model": "m", "messages": [[{"role": "user", "content": "x"}]], **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, (route, r.text)
    ok = c.post(route, json={"model": "m", "input": "x", "vllm_xargs": {"fuzz_strength": 1}})
    assert ok.status_code == 200 and ok.json()["body"]["vllm_xargs"] == {"fuzz_strength": 1}


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_session_header_is_refused(route):
    r = client().post(route, json={"model": "m", "prompt": "p"}, headers={"X-Session-ID": "other-client"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-session-id"


@pytest.mark.parametrize(
    "body, param, config",
    [
        ({"n": 9}, "n", {}),
        ({"best_of": 100}, "best_of", {}),
        ({"n": 16384}, "n", {}),
        ({"use_beam_search": True, "n": 2}, "use_beam_search", {}),
        ({"use_beam_search": True, "n": 5}, "n", {"limits": {"beam_search": True}}),
        (
            {"messages": [[{"role": "user", "content": "x"}]] * 17},
            "messages",
            {"routes": ("/v1/chat/completions/batch",)},
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"enum": ["x" * 100] * 200}}}},
            "response_format",
            {"limits": {"structured_outputs": True}},
        ),
        (
            {"structured_outputs": {"regex": "a" * 20000}},
            "structured_outputs",
            {"limits": {"structured_outputs": True}},
        ),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"enum": ["x" * 100] * 200}}}],
                "tool_choice": "required",
            },
            "tools",
            {"limits": {"structured_outputs": True}},
        ),
        ({"n": 3}, "n", {"limits": {"max_n": 2}}),
    ],
)
def test_expensive_parameters_are_capped(body, param, config):
    route = "/v1/chat/completions/batch" if "routes" in config else "/v1/chat/completions"
    r = client(**config).post(route, json={"model": "m", "messages": [], **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert param in r.json()["error"]["message"]


def test_caps_let_ordinary_requests_through():
    c = client(limits={"beam_search": True})
    for body in (
        {"n": 8},
        {"best_of": 8},
        {"use_beam_search": True, "n": 4},
        {"response_format": {"type": "text"}},
        {"n": True},
    ):  # a bool n is vLLM's to refuse, not a count
        assert c.post("/v1/chat/completions", json={"model": "m", "messages": [], **body}).status_code == 200, body


TOOL: dict[str, Any] = {"type": "function", "function": {"name": "f", "parameters": {}}}
SPECS = [  # (body, the field that carries a spec vLLM may compile into a grammar)
    ({"structured_outputs": {"regex": "([a-z]{0,50}){0,50}"}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": "string"}}}, "structured_outputs"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string"}}}},
        "response_format",
    ),
    ({"response_format": {"type": "structural_tag", "format": {}}}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),  # JSON mode: a 500 on this stack
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools"),
    ({"tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "any"}}, "tools"),
    # "auto" (or no tool_choice) compiles the tools where a tool parser is configured and a tool is strict
    ({"tools": [{**TOOL, "function": {**TOOL["function"], "strict": True}}], "tool_choice": "auto"}, "tools"),
    ({"tools": [TOOL]}, "tools"),
    (
        {
            "tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        },
        "tools",
    ),
]


@pytest.mark.parametrize("body, param", SPECS)
def test_structured_outputs_are_off_by_default_naming_the_field(body, param):
    r = client().post("/v1/chat/completions", json={"model": "m", "messages": [], **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and "structured outputs are off" in r.json()["error"]["message"]
    on = client(limits={"structured_outputs": True}).post(
        "/v1/chat/completions", json={"model": "m", "messages": [], **body}
    )
    assert on.status_code == 200, on.text


@pytest.mark.parametrize(
    "body",
    [
        {"response_format": {"type": "text"}},
        {"text": {"format": {"type": "text"}}},
        {"text": {"verbosity": "low"}},
        {"text": "hi"},
        {"output_config": {"effort": "low"}},
        {"tools": [TOOL], "tool_choice": "none"},
        {
            "tools": [{"name": "f", "input_schema": {}}],
            "tool_choice": {"type": "none", "disable_parallel_tool_use": False},
        },
        {"tool_choice": "required"},  # no tools: nothing to compile (vLLM's to refuse)
    ],
)
def test_what_compiles_no_client_spec_passes_with_structured_outputs_off(body):
    r = client().post("/v1/chat/completions", json={"model": "m", "messages": [], **body})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "field",
    [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
    ],
)
@pytest.mark.parametrize("limits", [{}, {"structured_outputs": True}])
def test_removed_guided_fields_are_refused_not_silently_ignored(field, limits):
    """vLLM 0.32 ignores them (200, unconstrained output): the client is told, whatever the limits."""
    r = client(limits=limits).post("/v1/completions", json={"model": "m", "prompt": "p", field: "a+"})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert "removed from vLLM" in r.json()["error"]["message"]


def test_deeply_nested_json_is_a_400_not_a_crash():
    r = client().post("/v1/completions", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested" in r.json()["error"]["message"]


def test_routes_config_is_checked_when_loaded():
    with pytest.raises(ValueError, match="unknown route"):
        GuardConfig(routes=("/v1/completions", "/nope"))
    with pytest.raises(ValueError, match=r"cannot be switched on.*token-in generation"):
        GuardConfig(routes=("/inference/v1/generate",))
    assert GuardConfig().routes == DEFAULT_ROUTES


def test_keys_are_compared_as_digests_of_any_length():
    c = client("short,a-much-longer-key-" + "x" * 100)
    body = {"model": "m", "prompt": "p"}
    for key, status in (
        ("short", 200),
        ("a-much-longer-key-" + "x" * 100, 200),
        ("shor", 401),
        ("shortt", 401),
        ("a-much-longer-key-", 401),
        ("", 401),
    ):
        headers = {"Authorization": f"Bearer {key}"}
        assert c.post("/v1/completions", json=body, headers=headers).status_code == status, key
    guard = c.app
    assert isinstance(guard, RequestGuard)
    assert all(len(d) == 32 for d in guard._digests) and b"short" not in guard._digests


# a POST to /v1/completions from this host, as an ASGI server hands it to the guard
COMPLETIONS_SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/completions",
    "headers": [(b"host", b"localhost")],
    "root_path": "",
}


def test_a_slow_body_gets_408():
    import asyncio

    guard = RequestGuard(
        Starlette(routes=[Route("/v1/completions", echo, methods=["POST"])]),
        GuardConfig(api_keys_env=None, body_timeout_s=0.2),
    )
    sent: list[Any] = []  # a marker (1) for the body's first part, then the messages sent

    async def receive():
        if not sent:
            sent.append(1)
            return {"type": "http.request", "body": b'{"prompt": "', "more_body": True}
        await asyncio.sleep(3600)  # the rest never comes

    async def send(message):
        sent.append(message)

    scope = dict(COMPLETIONS_SCOPE)  # the app adds keys to its scope
    asyncio.run(asyncio.wait_for(guard(scope, receive, send), 5))
    start = next(m for m in sent if isinstance(m, dict) and m["type"] == "http.response.start")
    assert start["status"] == 408


def test_the_body_is_read_in_the_requests_own_task():
    """Every task the guard starts costs a request turns of a busy event loop before vLLM sees it (the request
    timeline, docs/benchmarks.md): the body is read by the task that serves the request, the app sees it whole,
    and a deadline still applies (test_a_slow_body_gets_408). Negative control: under asyncio.wait_for, Python
    3.11 reads in a task of its own, which this test sees."""
    import asyncio

    readers: list[Any] = []
    sent: list[Any] = []

    async def receive():
        readers.append(asyncio.current_task())
        return {"type": "http.request", "body": b'{"prompt": "hi", "max_tokens": 1}', "more_body": False}

    async def send(message):
        sent.append(message)

    guard = RequestGuard(
        Starlette(routes=[Route("/v1/completions", echo, methods=["POST"])]), GuardConfig(api_keys_env=None)
    )
    scope = dict(COMPLETIONS_SCOPE)  # the app adds keys to its scope

    async def serve():
        await guard(scope, receive, send)
        return asyncio.current_task()

    request_task = asyncio.run(serve())
    assert readers and all(t is request_task for t in readers)
    assert next(m for m in sent if m["type"] == "http.response.start")["status"] == 200

    async def in_a_task_of_its_own():  # the control: what wait_for does
        return await asyncio.wait_for(receive(), 1)

    async def control():
        await in_a_task_of_its_own()
        return asyncio.current_task()

    readers.clear()
    assert asyncio.run(control()) is not readers[0]


@pytest.mark.parametrize(
    "host, keys, allow, ok",
    [
        ("127.0.0.1", "", False, True),
        ("localhost", "", False, True),
        ("::1", "", False, True),
        ("0.0.0.0", "", False, False),
        ("10.1.2.3", "", False, False),
        ("myhost", "", False, False),
        ("0.0.0.0", "k1", False, True),
        ("0.0.0.0", "", True, True),
    ],
)
def test_no_auth_only_on_loopback_unless_allowed(host, keys, allow, ok):
    from serve_app.ingress.guard import require_auth

    cfg = GuardConfig(allow_no_auth=allow)
    if ok:
        require_auth(cfg, host, {"FUZZSERVE_API_KEYS": keys})
        return
    with pytest.raises(ValueError) as e:
        require_auth(cfg, host, {"FUZZSERVE_API_KEYS": keys})
    assert "FUZZSERVE_API_KEYS" in str(e.value) and "allow_no_auth" in str(e.value) and host in str(e.value)


def test_config_is_strict():
    with pytest.raises(ValueError):
        GuardConfig(max_body_bytes=0)
    with pytest.raises(ValueError):
        GuardConfig.model_validate({"api_key": "x"})


def test_a_stream_that_fails_midway_ends_with_an_error_event():
    import asyncio

    from serve_app.router_path import error_terminated

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
    err = json.loads(out[1][len("data: ") :])["error"]
    assert err["code"] == 500 and "ActorDiedError" in err["message"]
    assert asyncio.run(collect(healthy())) == ["data: 1\n\n", "data: [DONE]\n\n"]


@pytest.mark.parametrize(
    "host, ok",
    [
        ("127.0.0.1:8000", True),
        ("localhost:8000", True),
        ("[::1]:8000", True),
        ("127.0.0.2", True),
        ("LOCALHOST", True),
        ("evil.example:8000", False),
        ("10.0.0.5:8000", False),
        ("", False),
        ("localhost.evil.example", False),
    ],
)
def test_without_keys_only_requests_addressed_to_this_machine_are_answered(host, ok):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 makes the browser send that name as Host."""
    r = client("").post("/v1/completions", json={"model": "m"}, headers={"host": host})
    assert r.status_code == (200 if ok else 403), r.text
    if not ok:
        assert r.json()["error"]["param"] == "Host"
    assert client("").get("/health", headers={"host": "evil.example"}).status_code == 200, "probes stay open"
    # with keys, the key decides and any Host is fine (a gateway in front names itself)
    keyed = client("k1").post(
        "/v1/completions", json={"model": "m"}, headers={"host": host or "x", "authorization": "Bearer k1"}
    )
    assert keyed.status_code == 200
