"""Every route the replica's app serves has a guard policy: checked against the live apps, not a list.

The apps are built the way the replica and the router path's ingress build
them (vLLM's own ``build_app`` for a generate model, plus what
``ray.serve.llm`` and ``FuzzServer`` add; ``OpenAiIngress``'s app through
``make_fastapi_ingress``), and their route tables are read from them. A route
added to either without a policy fails here, and the replica refuses to start
with it (serve_app/engine/direct_server.py).
"""

from __future__ import annotations

import pytest

from serve_app.ingress.route_policy import BY_PATH, DEFAULT_ROUTES, ROUTES, Route, RouteTable, app_paths, unreviewed


def vllm_app():
    """vLLM 0.32's OpenAI app for a generate model, as ray.serve.llm's engine builds it, plus LLMServer's route."""
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", "/nonexistent"])
    app = build_app(args, supported_tasks=("generate",))
    app.add_api_route("/v1/models/{model:path}", lambda model: None, methods=["GET"])  # LLMServer adds it
    app.add_api_route("/ready", lambda: None, methods=["GET"])  # FuzzServer adds it
    return app


def router_path_app():
    """The router path's ingress app: OpenAiIngress's routes and the probes, as serve_app.app builds it."""
    from ray.serve.llm.ingress import make_fastapi_ingress

    from serve_app.ray_internals import init_ingress_app
    from serve_app.router_path import ENDPOINTS, FuzzIngress

    app = init_ingress_app()
    make_fastapi_ingress(FuzzIngress, endpoint_map=ENDPOINTS, app=app)
    return app


@pytest.mark.parametrize("build", [vllm_app, router_path_app], ids=["direct", "router"])
def test_every_route_of_the_live_app_has_a_policy(build):
    paths = app_paths(build())
    assert len(paths) >= 10, paths  # the app was really built
    assert unreviewed(paths) == []


def test_a_route_added_without_a_policy_is_named():
    app = vllm_app()
    app.add_api_route("/v1/new_thing", lambda: None, methods=["POST"])
    assert unreviewed(app_paths(app)) == ["/v1/new_thing"]


def test_the_generate_routes_of_the_live_app_are_all_checked():
    """Every POST route of vLLM's app whose body reaches the engine's sampling parameters is `checked` or
    `refused`: none is `read` or `open` (those pass bodies through unchecked)."""
    from fastapi.routing import APIRoute

    for r in vllm_app().routes:
        if isinstance(r, APIRoute) and "POST" in r.methods and r.path not in ("/ping",):
            assert BY_PATH[r.path].policy in ("checked", "refused"), r.path


def matched(table: RouteTable, path: str) -> Route:
    """The route ``path`` falls under, asserting that one does."""
    route = table.match(path)
    assert route is not None, path
    return route


def test_default_routes():
    table = RouteTable()
    assert [r.path for r in table.enabled] == list(DEFAULT_ROUTES)
    assert matched(table, "/v1/completions").policy == "checked"
    assert matched(table, "/v1/models/some/model").path == "/v1/models/{model:path}"
    assert matched(table, "/metrics/").path == "/metrics"
    assert matched(table, "/health").policy == "open"
    for path in ("/v1/responses", "/docs", "/v1/completionsX", "/v1/completions/render", "/", ""):
        assert table.match(path) is None, path
    assert all(r.policy != "refused" for r in table.enabled)


def test_each_refused_route_says_why_and_cannot_be_enabled():
    for r in ROUTES:
        assert r.why
        if r.policy == "refused":
            with pytest.raises(ValueError, match="cannot be switched on"):
                RouteTable((r.path,))
