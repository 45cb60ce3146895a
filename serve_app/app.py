"""Application builder for ``serve run`` / ``serve deploy`` (``import_path: serve_app.app:build_app``).

Mirrors ``ray.serve.llm.build_openai_app``: the arguments are validated by a
pydantic model (:class:`FuzzServeArgs`, a superset of ``LLMServingArgs``),
the engine replicas are ``ray.serve.llm``'s ``LLMServer`` deployments built by
``build_llm_deployment``. What this builder adds:

* a ``model_source`` that names a path under the project root (what
  ``serve_config.yaml`` ships: ``.cache/models/fixture``, the fixture model
  that ``python -m fixture_model.build`` builds) is made absolute, since
  Serve's processes do not run in the project's directory
  (:func:`resolve_model_source`); the builder builds no model;
* ``ingress:`` picks the HTTP path. ``direct`` (the default, what
  ``serve_config.yaml`` ships): Ray's direct streaming through HAProxy, the
  checks and probes inside each engine replica
  (:mod:`serve_app.engine.direct_server`). ``router``: Serve's default path, a
  :class:`serve_app.router_path.FuzzIngress` deployment (the HTTP ingress, an
  ``OpenAiIngress``) in front of the replicas, costlier per request (docs/serve.md);
* :class:`serve_app.ingress.guard.RequestGuard` outermost on whichever app answers
  HTTP, configured by ``guard:``;
* ``routing:`` picks the request router of every engine deployment, unless a
  model's ``deployment_config`` names one itself;
* ``engine_cores_per_replica`` gives each engine replica on a CPU node its
  own cores (``serve_app.engine.core_binding``);
* ``engine_replicas: fit`` sizes the engine deployment to the cluster: as
  many replicas as its nodes' CPUs hold, each counted as its engine's cores
  plus one for its HTTP frontend (:func:`fit_replicas`; docs/serve.md);
* a single-replica engine deployment on the direct path gets no ingress
  request router: with one replica there is nothing to choose, and the
  router's HTTP round trip on every request is pure cost (HAProxy forwards
  to the replica itself).

Every private Ray symbol used here comes from :mod:`serve_app.ray_internals`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from serve_app.config.deploy_config import DeploymentOptions, FuzzServeArgs, ingress_deployment_options
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX
from serve_app.engine.cluster_env import HAPROXY_ENV
from serve_app.routing.routers import BODY_AWARE, ROUTERS

__all__ = [
    "FuzzServeArgs",
    "build_app",
]  # FuzzServeArgs lives with the rest of the config (serve_app.config.deploy_config)


# Where a relative model_source is looked for: the project's root (serve_config.yaml's directory).
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# What fit counts per engine replica besides its engine's cores: its HTTP frontend
# (Serve's replica actor: vLLM's OpenAI app, AsyncLLM, tokenizing, streaming),
# which ray.serve.llm reserves one CPU for by default.
FRONTEND_CPUS = 1


def fit_replicas(node_cpus: list[float], engine_cores_per_replica: int | None) -> int:
    """Engine replicas that the nodes' CPUs hold, one frontend CPU + the engine's cores each; at least 1.

    Why not two replicas on a 2-core node: each replica's frontend needs about
    as much CPU per request as its engine (measured: benchmarks/vs_vllm.py,
    docs/serve.md), and two engines on one core each batch half the requests,
    paying each step's fixed cost twice; two replicas on 2 cores serve about
    0.75x of what one does there.
    """
    per_replica = (engine_cores_per_replica or 1) + FRONTEND_CPUS
    return max(1, sum(int(c // per_replica) for c in node_cpus))


def cluster_node_cpus() -> list[float]:
    """The CPUs (Ray's logical CPUs: ``ray start --num-cpus``, by default the node's cores) of every alive node."""
    import ray

    if not ray.is_initialized():
        raise ValueError(
            "engine_replicas: fit sizes the deployment to a running Ray cluster; build the app on one "
            "(serve deploy / serve run) or give engine_replicas a number"
        )
    return [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]


def max_replicas(deployment_config: DeploymentOptions | Mapping[str, Any]) -> int | float:
    """The most replicas a deployment config lets Serve run (``num_replicas: auto`` autoscales: unbounded)."""
    return _options(deployment_config).max_replicas()


def _options(deployment_config: DeploymentOptions | Mapping[str, Any]) -> DeploymentOptions:
    if isinstance(deployment_config, DeploymentOptions):
        return deployment_config
    return DeploymentOptions.model_validate(dict(deployment_config))


def resolve_model_source(source: str, root: Path | None = None) -> str:
    """``source`` made absolute where it names a path under the project root; anything else (an absolute path, a
    model hub id) unchanged. A relative path starting with ``.`` that does not exist is an error naming the fix."""
    root = PROJECT_ROOT if root is None else root
    if os.path.isabs(source):
        return source
    local = root / source
    if local.exists():
        return str(local.resolve())
    if source.startswith("."):
        raise ValueError(
            f"model_source {source!r}: no such path under {root} (the fixture model: build it with "
            "`python -m fixture_model.build` before deploying)"
        )
    return source


def resolve_llm_configs(
    args: FuzzServeArgs,
    node_cpus: Callable[[], list[float]] | None = None,
) -> list[dict[str, Any]]:
    """The LLMConfig dicts with local model paths resolved, replicas counted and the request router set.

    The request router is set wherever the deployment can run more than one
    replica (or on the router path, where the ingress calls through a handle);
    a single replica on the direct path gets none (:func:`needs_request_router`).
    """
    router_config = ROUTERS[args.routing]
    configs = []
    for llm in args.llm_configs:
        loading = llm.model_loading_config
        if isinstance(loading.model_source, str):
            loading = loading.model_copy(update={"model_source": resolve_model_source(loading.model_source)})
        deployment = llm.deployment_config
        if args.engine_replicas is not None:
            given = sorted({"num_replicas", "autoscaling_config"} & deployment.model_fields_set)
            if given:
                raise ValueError(
                    f"engine_replicas is set and model {loading.model_id!r}'s deployment_config "
                    f"sets {', '.join(given)}: give the replica count in one place"
                )
            replicas = (
                fit_replicas((node_cpus or cluster_node_cpus)(), args.engine_cores_per_replica)
                if args.engine_replicas == "fit"
                else args.engine_replicas
            )
            deployment = deployment.model_copy(update={"num_replicas": replicas})
        if (
            needs_request_router(args.ingress, deployment)
            and "request_router_config" not in deployment.model_fields_set
        ):
            # Always explicit: the direct path's default would otherwise be Ray's round robin.
            deployment = deployment.model_copy(update={"request_router_config": copy.deepcopy(router_config)})
        # LLMSpec.to_dict deep-copies each: two configs may share a nested dict (YAML anchors)
        configs.append(
            llm.model_copy(update={"model_loading_config": loading, "deployment_config": deployment}).to_dict()
        )
    return configs


def needs_request_router(ingress: str, deployment_config: DeploymentOptions | Mapping[str, Any]) -> bool:
    """Whether an engine deployment gets a request router (and, on the direct path, an ingress request router).

    On the direct path Serve refuses a custom request router on an ingress
    deployment that HAProxy balances itself, so a single-replica deployment
    must carry none.
    """
    return ingress == "router" or max_replicas(deployment_config) > 1


def engine_deployment(llm_config, server_kwargs: dict[str, Any]):
    """One model's engine deployment: :class:`EngineServer`, or the ``server_cls`` the model's config names."""
    from ray.serve.llm import build_llm_deployment

    from serve_app.engine.core_binding import EngineServer

    if llm_config.server_cls is not None:  # the user's own server class, as build_openai_app would use it
        changed = sorted(k for k, v in server_kwargs.items() if v != FuzzServeArgs.model_fields[k].default)
        if changed:
            raise ValueError(
                f"model {llm_config.model_id!r} names server_cls {llm_config.server_cls!r}; "
                f"{', '.join(changed)} need the default server class"
            )
        return build_llm_deployment(llm_config)
    # name_prefix keeps Serve's deployment name ("LLMServer:<model>") that dashboards and the monitor know
    return build_llm_deployment(
        llm_config, deployment_cls=EngineServer, name_prefix=ENGINE_DEPLOYMENT_PREFIX, bind_kwargs=server_kwargs
    )


def build_app(args: dict[str, Any]):
    """Build the Serve application graph of ``args`` (see :class:`FuzzServeArgs`)."""
    from ray.serve.llm import LLMConfig

    parsed = FuzzServeArgs.model_validate(args)
    llm_configs = [LLMConfig.model_validate(c) for c in resolve_llm_configs(parsed)]
    if len({c.model_id for c in llm_configs}) != len(llm_configs):
        raise ValueError("model ids must be unique across llm_configs")
    if parsed.ingress == "direct":
        from serve_app.engine.direct_server import build_direct

        if len(llm_configs) != 1 or parsed.ingress_deployment_config:
            raise ValueError(
                "ingress: direct serves exactly one model and has no ingress deployment to configure "
                "(ingress_deployment_config); use ingress: router for several models"
            )
        routed = needs_request_router(parsed.ingress, llm_configs[0].deployment_config)
        require_haproxy(body_aware_routing=routed and parsed.routing in BODY_AWARE)
        return build_direct(llm_configs[0], parsed.guard, parsed.server_kwargs(), ingress_request_router=routed)
    return build_router(parsed, llm_configs)


def require_haproxy(body_aware_routing: bool, environ: dict[str, str] | None = None) -> None:
    """Refuse ``ingress: direct`` on a cluster without Serve's HAProxy (and, for body-aware routing,
    without the body forwarded to the ingress request router), naming the setting.

    Without HAProxy, Serve ignores the ingress request router and its Python
    proxy sends every request to whichever replica it likes; without the
    body, a prefix-aware router silently degrades to load balancing. Failing
    the deploy with the fix beats a silently different deployment. The
    builder runs on the cluster with ``ray start``'s environment, which is
    where the switches must be set.
    """
    env = os.environ if environ is None else environ
    missing = [k for k in HAPROXY_ENV[: 2 if body_aware_routing else 1] if env.get(k) != "1"]
    if missing:
        raise ValueError(
            f"ingress: direct needs {', '.join(f'{k}=1' for k in missing)} in the environment of "
            "`ray start` (scripts/env.sh sets it: `source scripts/env.sh` before `ray start` or "
            "`serve run`); or deploy with ingress: router"
        )


def build_router(parsed: FuzzServeArgs, llm_configs: list):
    """Serve's default path: FuzzIngress (guarded) -> one LLMServer deployment per model."""
    from ray import serve
    from ray.serve.llm.ingress import make_fastapi_ingress
    from starlette.exceptions import HTTPException

    from serve_app.ingress.guard import RequestGuard
    from serve_app.observability.fuzz_traffic import FuzzTraffic
    from serve_app.ray_internals import init_ingress_app, to_model_metadata
    from serve_app.router_path import ENDPOINTS, FuzzIngress, openai_http_error

    app = init_ingress_app()  # OpenAiIngress's FastAPI app: error handling, CORS, metrics, request ids
    app.add_middleware(RequestGuard, config=parsed.guard, on_admitted=FuzzTraffic().record)  # added last = runs first
    app.add_exception_handler(HTTPException, openai_http_error)
    ingress_cls = make_fastapi_ingress(FuzzIngress, endpoint_map=ENDPOINTS, app=app)
    options = ingress_deployment_options(
        FuzzIngress.get_deployment_options(llm_configs), parsed.ingress_deployment_config
    )
    return serve.deployment(**options)(ingress_cls).bind(
        llm_deployments={c.model_id: engine_deployment(c, parsed.server_kwargs()) for c in llm_configs},
        model_cards={c.model_id: to_model_metadata(c.model_id, c) for c in llm_configs},
        lora_paths={
            c.model_id: c.lora_config.dynamic_lora_loading_path for c in llm_configs if c.lora_config is not None
        },
        guard=parsed.guard.model_dump(),
    )
