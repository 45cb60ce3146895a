"""Every private Ray symbol this project uses, in one place, each with why no public API serves.

The rest of ``serve_app`` uses ``ray.serve.llm``'s public API (``LLMConfig``,
``LLMServer``, ``build_llm_deployment``, ``OpenAiIngress``,
``make_fastapi_ingress``, ``PrefixCacheAffinityRouter``) and Serve's
(``serve.deployment``, ``serve.ingress``). What it cannot do with them is
listed here, verified on Ray :data:`VERIFIED_RAY`. If a later Ray moves or
renames one, importing this module fails at once with :class:`RayInternalsMoved`,
naming the symbol, the Ray version found and the one verified, instead of an
``ImportError`` deep inside a replica's start-up.

==========================================  =====================================================
symbol                                      why it is needed
==========================================  =====================================================
``ingress.init``                            the FastAPI app ``build_openai_app`` gives
                                            ``OpenAiIngress`` (error handling, CORS, HTTP
                                            metrics, request ids); the router path installs the
                                            guard on it before ``make_fastapi_ingress`` binds the
                                            routes. Public builders build it internally only.
``ingress.DEFAULT_ENDPOINTS``               ``OpenAiIngress``'s route table, extended by the
                                            router path with ``/health`` and ``/ready``.
``configs.openai_api_models                 the model cards ``OpenAiIngress`` lists at
.to_model_metadata``                        ``/v1/models``, built as ``build_openai_app`` does.
``router.LLMRouter``                        the direct path's ingress request router: HAProxy
                                            asks it (``POST /internal/route``) which replica
                                            takes a request; it asks the engine deployment's
                                            request router. Ray builds it only inside
                                            ``build_openai_app``. ``LLMRouterBase`` is the class
                                            Serve's ingress wrapper wraps (its first base):
                                            ``serve_app.routing.ingress_router`` serves its ``route``
                                            behind a bounded view of the body.
``Application._with_ingress_request_router``  attaches that router to the direct ingress
                                            (Serve calls it an "internal-only, unstable hook for
                                            the Serve LLM direct-ingress stack").
``llm_server._add_middleware_to_built_app`` adds the guard to the vLLM app a replica builds in
                                            ``__serve_build_asgi_app__`` (vLLM builds its
                                            middleware stack eagerly, so Starlette's
                                            ``add_middleware`` refuses afterwards).
``context._get_global_client``              the HTTP options Serve's controller holds
(``get_http_config``)                       (``http_options.host``: what the proxy and, on the
                                            direct path, every ingress replica bind), which the
                                            guard checks before serving without API keys.
                                            No public API returns them.
``RequestRouter._probe_queue_lens``         the replicas' in-flight request counts, asked for
                                            by ``FuzzAffinityRouter`` (the public request-router
                                            API exposes only a cache that nothing refreshes on
                                            the direct path).
``ServeInstanceDetails._get_status``        what ``serve status`` prints, made from the Serve
                                            details the dashboard's REST API returns: the load
                                            tests' ``LocalCluster`` polls the dashboard in this
                                            process instead of starting ``serve status`` (a
                                            process importing Ray) every few seconds. The CLI
                                            calls it; no public API returns the status.
``LLMServer._start_engine``,                Ray Serve LLM's engine start, which after the engine
``usage_lib.usage_stats_enabled``           starts pushes a usage-telemetry report: it creates a
                                            detached actor (``ray::TelemetryAgent``, one process
                                            on the head node) to record usage tags that Ray sends
                                            only when usage stats are on. The project's replicas
                                            skip that report when they are off
                                            (``RAY_USAGE_STATS_ENABLED=0`` in their environment;
                                            ``ray start --disable-usage-stats`` sets it on the
                                            head only, ``LocalCluster`` on every node):
                                            :func:`llm_usage_telemetry_wanted`.
==========================================  =====================================================
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any

import ray
from ray.serve.deployment import Application
from ray.serve.request_router import RequestRouter

VERIFIED_RAY = "2.60.0"


class RayInternalsMoved(ImportError):
    pass


def _load(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise RayInternalsMoved(
            f"Ray {ray.__version__}: {module}.{name} is gone or moved ({type(e).__name__}: {e}); serve_app uses "
            f"it as verified on Ray {VERIFIED_RAY} (see serve_app/ray_internals.py for why). Pin ray=={VERIFIED_RAY} "
            "or port serve_app/ray_internals.py to this Ray."
        ) from e


# The symbols of Ray modules that import vLLM load on first use (PEP 562 ``__getattr__`` below), with the same
# RayInternalsMoved: the ingress request router's replicas (serve_app.routing.ingress_router, fuzz_router) need
# only the symbols loaded here, and importing vLLM costs each of them ~13 s of CPU at every start, on the host
# whose engines are starting beside it during a rollout.
_INGRESS = "ray.llm._internal.serve.core.ingress.ingress"
_ON_FIRST_USE = {
    "init_ingress_app": (_INGRESS, "init"),
    "DEFAULT_ENDPOINTS": (_INGRESS, "DEFAULT_ENDPOINTS"),
    "to_model_metadata": ("ray.llm._internal.serve.core.configs.openai_api_models", "to_model_metadata"),
    "add_middleware_to_built_app": ("ray.llm._internal.serve.core.server.llm_server", "_add_middleware_to_built_app"),
}


def __getattr__(name: str) -> Any:
    if name not in _ON_FIRST_USE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = _load(*_ON_FIRST_USE[name])
    globals()[name] = value
    return value


LLMRouter = _load("ray.llm._internal.serve.core.ingress.router", "LLMRouter")
LLMRouterBase = LLMRouter.__bases__[0]
if not all(hasattr(LLMRouterBase, a) for a in ("route", "_pick_replica")) or LLMRouterBase.__name__ != "LLMRouter":
    raise RayInternalsMoved(
        f"Ray {ray.__version__}: LLMRouter is no longer Serve's ingress wrapper around a class "
        f"with route() and _pick_replica(); verified on Ray {VERIFIED_RAY} "
        "(serve_app/ray_internals.py, serve_app/routing/ingress_router.py)"
    )
if not hasattr(Application, "_with_ingress_request_router"):
    raise RayInternalsMoved(
        f"Ray {ray.__version__}: Application._with_ingress_request_router is gone; "
        f"the direct path was verified on Ray {VERIFIED_RAY} (serve_app/ray_internals.py)"
    )


_probe: Any = getattr(RequestRouter, "_probe_queue_lens", None)
if _probe is None:
    raise RayInternalsMoved(
        f"Ray {ray.__version__}: RequestRouter._probe_queue_lens is gone; fuzz_affinity "
        f"routing was verified on Ray {VERIFIED_RAY} (serve_app/ray_internals.py)"
    )


_get_global_client = _load("ray.serve.context", "_get_global_client")

_usage_stats_enabled = _load("ray._common.usage.usage_lib", "usage_stats_enabled")
# Set to 1 in ``ray start``'s environment, Ray's own engine start runs as it ships (the telemetry actor and its
# report with it): the A/B switch of :func:`llm_usage_telemetry_wanted`.
LLM_TELEMETRY_SWITCH = "FUZZSERVE_RAY_LLM_TELEMETRY"

_serve_details: Any = _load("ray.serve.schema", "ServeInstanceDetails")
if not hasattr(_serve_details, "_get_status"):
    raise RayInternalsMoved(
        f"Ray {ray.__version__}: ServeInstanceDetails._get_status is gone; the status `serve status` prints was "
        f"verified on Ray {VERIFIED_RAY} (serve_app/ray_internals.py)"
    )


def serve_http_host() -> str:
    """``http_options.host`` of the running Serve instance (blocking: one call to Serve's controller)."""
    controller = _get_global_client()._controller
    return ray.get(controller.get_http_config.remote()).host


async def probe_queue_lens(router, replicas: list) -> list[tuple]:
    """[(replica, in-flight requests or None if it did not answer in time)] for ``replicas``, asked now."""
    return await _probe(router, replicas, 0)


def with_ingress_request_router(ingress, router):
    """``ingress`` (an Application) with ``router`` (an Application) as its ingress request router."""
    return ingress._with_ingress_request_router(router)


def serve_status(details: dict[str, Any]) -> dict[str, Any]:
    """What ``serve status`` prints (applications, deployments, replica states, proxies) for ``details``, the JSON
    of the dashboard's ``GET /api/serve/applications/``: read by Ray's schema, as the CLI reads it."""
    status = _serve_details(**details)._get_status()
    # JSON round trip: Serve's status enums (str subclasses) become the plain strings `serve status` prints
    return json.loads(json.dumps(dataclasses.asdict(status)))


def llm_usage_telemetry_wanted(version: str = ray.__version__) -> bool:
    """Whether a replica's engine start should push Ray Serve LLM's usage-telemetry report, as Ray's own does (read
    in the replica, from the environment ``ray start`` passed down: ``RAY_USAGE_STATS_ENABLED`` and the switch).

    What it changes: with usage stats off, a replica starts its engine without the report
    (``EngineServer._start_engine``). Why: Ray 2.60's ``LLMServer._start_engine`` then creates a detached actor,
    ``ray::TelemetryAgent``, a process of its own on the head node whose core worker takes about 6 ms of CPU every
    second for as long as the cluster runs (``benchmarks.investigations.idle_cost``, docs/serve.md), to write usage
    tags that Ray reports only when usage stats are on; with them off nothing reads them. Upstream: none filed;
    offered in docs/benchmarks.md ("For Ray upstream"). Verified on Ray :data:`VERIFIED_RAY`; on any other version
    Ray's own start runs (its steps may have changed). Remove when Ray creates the actor only where usage stats are
    reported. Switch: ``FUZZSERVE_RAY_LLM_TELEMETRY=1`` runs Ray's own start (A/B)."""
    if os.environ.get(LLM_TELEMETRY_SWITCH) == "1" or version != VERIFIED_RAY:
        return True
    return bool(_usage_stats_enabled())


def require_start_engine(server_class: type) -> None:
    """Fail at import, naming it, where ``LLMServer._start_engine`` (the step ``EngineServer`` overrides) is gone
    (checked by ``serve_app.engine.core_binding``, which imports vLLM's side of Ray Serve LLM anyway; the ingress
    routers' replicas import this module and must not)."""
    if not callable(getattr(server_class, "_start_engine", None)):
        raise RayInternalsMoved(
            f"Ray {ray.__version__}: LLMServer._start_engine is gone; the replica's engine start was verified on "
            f"Ray {VERIFIED_RAY} (serve_app/ray_internals.py, serve_app/engine/core_binding.py)"
        )
