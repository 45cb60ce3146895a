"""The shipped path: Ray's direct streaming, the ingress's checks inside each engine replica.

With ``ingress: direct`` (the builder's default, what ``serve_config.yaml``
deploys) the app has no separate ingress deployment on the request path:

1. Serve's HAProxy (on when ``ray start`` runs with
   ``RAY_SERVE_ENABLE_HA_PROXY=1``; ``scripts/env.sh`` and ``LocalCluster``
   set it) takes the client's connection;
2. with several replicas, it asks the app's *ingress request router*
   (``ray.serve.llm``'s ``LLMRouter`` behind a bounded view of the body,
   :mod:`serve_app.routing.ingress_router`; ``POST /internal/route``) which replica
   should serve the request; ``LLMRouter`` asks the engine deployment's request router
   (``routing:``; with ``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1`` it
   sees the body, so ``fuzz_affinity`` can key on fuzz salt + prompt);
3. HAProxy forwards the HTTP connection straight to that replica, where
   :class:`FuzzServer` answers: vLLM's own OpenAI app with the guard outermost.

That takes the ingress replica and Serve's Python proxy off every request and
every streamed chunk (docs/benchmarks.md measures what they cost). What the
ingress did moves into the replica:

* :class:`serve_app.ingress.guard.RequestGuard` outermost on vLLM's app: API keys,
  body limit, ``vllm_xargs`` policy, reserved keys, 4xx naming the field,
  before vLLM parses the body;
* ``GET /ready``: this replica's engine answers its health check (HAProxy only
  forwards to replicas Serve considers healthy, so a 200 means the model has a
  serving replica); 503 naming the model otherwise;
* ``GET /health``: ``{"status": "ok"}`` while this replica's engine is alive
  (vLLM's own ``/health`` answers with an empty body), 503 otherwise.

One model per app (Ray's limit for direct streaming). A replica killed
mid-stream cuts its clients' connections: there is no router left to end
their streams with an error event, so clients see a transport error
(docs/serve.md).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX
from serve_app.engine.core_binding import EngineServer
from serve_app.ingress import probes
from serve_app.ingress.guard import GuardConfig, RequestGuard, require_auth
from serve_app.ingress.route_policy import app_paths, unreviewed
from serve_app.observability.fuzz_traffic import FuzzTraffic
from serve_app.ray_internals import add_middleware_to_built_app, serve_http_host, with_ingress_request_router

# How long a stopped ingress request router keeps answering routing calls (Serve's
# ``graceful_shutdown_wait_loop_s``: a stopping replica sleeps that long before it
# checks for requests in flight and closes its HTTP listener; Serve's default is 2 s).
# Why: a redeploy replaces the routers (Serve versions every deployment of an app by
# a hash of its args), and each change of the router or replica set reloads HAProxy.
# The old HAProxy process keeps a client's idle keep-alive connection and serves its
# next request with the old config, whose Lua router pool names the old routers;
# with them gone that request was refused, 503 ``router_unreachable``
# (docs/load_tests.md#refused-at-the-ingress, issue 34). Lingering covers that next
# request for every client whose idle connection lives less than this after the
# reload (aiohttp: 15 s, httpx and the openai SDK: 5 s), with room for the reload to
# lag the stop on a busy host. 30 s is what Serve itself gives an engine replica to
# leave the load balancer (``RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S``). ``serve
# shutdown`` stops the routers first and waits for them before it stops the engines
# (60 s in all, measured), unless the cluster's ``RAY_SERVE_SHUTDOWN_TIER_TIMEOUT_S``
# is short: serve_app/engine/cluster_env.py sets 5 s (back to ~35 s). A ``deployments:`` entry for
# ``LLMRouter`` in the Serve config overrides both values.
ROUTER_LINGER_S = 30.0
# The controller kills a stopping replica after this: two linger periods (a routing
# call in flight at the first check costs a second one) and 10 s to close.
ROUTER_SHUTDOWN_TIMEOUT_S = 2 * ROUTER_LINGER_S + 10


class FuzzServer(EngineServer):
    # Serve awaits an async constructor (LLMServer's own is one); mypy knows only the synchronous kind.
    async def __init__(self, llm_config, *, guard: dict[str, Any] | None = None, **kwargs):  # type: ignore[misc]
        self._guard_config = GuardConfig.model_validate(guard or {})
        # before the engine starts: a deployment that would serve anyone fails now, naming the fix
        require_auth(self._guard_config, await asyncio.to_thread(serve_http_host))
        await super().__init__(llm_config, **kwargs)

    async def ready(self, request: Request) -> JSONResponse:
        model = self._llm_config.model_id
        error = await probes.failure(self.check_health())
        return probes.not_ready({model: error}) if error else probes.ready([model])

    async def health(self, request: Request) -> JSONResponse:
        error = await probes.failure(self.check_health())
        return (
            probes.alive()
            if not error
            else JSONResponse(status_code=503, content={"status": "unhealthy", "error": error})
        )

    async def __serve_build_asgi_app__(self):
        app = await super().__serve_build_asgi_app__()
        # A route nobody decided about must not be reachable: a vLLM that adds one fails here, naming it.
        missing = unreviewed(app_paths(app))
        if missing:
            raise ValueError(
                f"the app serves routes without a guard policy: {missing}; add each to "
                "serve_app/ingress/route_policy.py ROUTES (checked, read, open or refused)"
            )
        # vLLM's /health (empty body) gives way to the router path's JSON answer.
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
        app.add_api_route("/health", self.health, methods=["GET"])
        app.add_api_route("/ready", self.ready, methods=["GET"])
        add_middleware_to_built_app(
            app, RequestGuard, config=self._guard_config, on_admitted=FuzzTraffic().record
        )  # outermost: runs first
        return app


def build_direct(llm_config, guard: GuardConfig, server_kwargs: dict[str, Any], ingress_request_router: bool = True):
    """The direct-streaming graph: FuzzServer deployment as the ingress; our ingress request router
    (:class:`~serve_app.routing.ingress_router.FuzzIngressRouter`) asks the engine deployment's request router (ours,
    ``routing:``) which replica takes each request.

    Without ``ingress_request_router`` (a single replica: nothing to pick)
    HAProxy forwards every request to the replica itself, without the
    router's HTTP round trip (measured: docs/serve.md).
    """
    from ray import serve
    from ray.serve.llm import build_llm_deployment

    server = build_llm_deployment(
        llm_config,
        deployment_cls=serve.ingress()(FuzzServer),
        # the deployment name dashboards, the monitor and LocalCluster know ("LLMServer:<model>")
        name_prefix=ENGINE_DEPLOYMENT_PREFIX,
        bind_kwargs={"guard": guard.model_dump(), **server_kwargs},
    )
    if not ingress_request_router:
        return server
    from serve_app.routing.ingress_router import FuzzIngressRouter

    # As Ray's own direct-streaming builder: no CPU reserved (it only answers
    # routing calls) and a high concurrency limit (it is on every request's path);
    # a stopped router keeps answering for ROUTER_LINGER_S (see there).
    router = serve.deployment(
        name="LLMRouter",
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0},
        graceful_shutdown_wait_loop_s=ROUTER_LINGER_S,
        graceful_shutdown_timeout_s=ROUTER_SHUTDOWN_TIMEOUT_S,
    )(FuzzIngressRouter)
    return with_ingress_request_router(server, router.bind(server=server))
