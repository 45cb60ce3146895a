"""Application builder for ``serve run`` / ``serve deploy`` (``import_path: serve_app.app:build_app``).

Mirrors ``ray.serve.llm.build_openai_app``: the arguments are validated by a
pydantic model (:class:`FuzzServeArgs`, a superset of ``LLMServingArgs``),
the engine replicas are ``ray.serve.llm``'s ``LLMServer`` deployments built by
``build_llm_deployment``, the ingress is an ``OpenAiIngress`` subclass. What
this builder adds:

* ``model_source: fixture`` resolves to the locally built fixture model
  (no model hub is reachable);
* the ingress is :class:`serve_app.router.FuzzRouter`, with
  :class:`serve_app.guard.RequestGuard` outermost on its FastAPI app (so the
  checks run before anything parses the body), configured by ``guard:``;
* ``routing:`` picks the request router of every engine deployment
  (``power_of_two`` | ``prefix_affinity`` | ``fuzz_affinity``), unless a
  model's ``deployment_config`` names one itself;
* ``ingress: direct`` builds Ray's direct-streaming graph instead, with the
  guard inside each replica (``serve_app.direct_server``);
* ``engine_cores_per_replica`` gives each engine replica on a CPU node its
  own cores (``serve_app.core_binding``).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .guard import GuardConfig
from .routing import ROUTERS


class FuzzServeArgs(BaseModel):
    """The builder's arguments (``args:`` of the application in ``serve_config.yaml``)."""

    model_config = ConfigDict(extra="forbid")

    llm_configs: list[dict[str, Any]] = Field(min_length=1, description="ray.serve.llm LLMConfig dicts")
    guard: GuardConfig = Field(default_factory=GuardConfig)
    routing: Literal["power_of_two", "prefix_affinity", "fuzz_affinity"] = "power_of_two"
    ingress: Literal["router", "direct"] = Field(
        "router", description="router: a FuzzRouter deployment in front of the replicas; direct: Ray's direct "
                              "streaming through HAProxy, the checks inside each replica (serve_app/direct_server.py)")
    ingress_deployment_config: dict[str, Any] = Field(default_factory=dict,
                                                      description="Serve options of the router deployment")
    engine_cores_per_replica: int | None = Field(
        None, ge=1, description="CPU hosts: bind each engine replica's OpenMP threads to its own this many cores "
                                "(by its rank on the node, serve_app/core_binding.py); null: vLLM's auto binding")


def resolve_llm_configs(args: FuzzServeArgs) -> list[dict[str, Any]]:
    """The LLMConfig dicts with the fixture model resolved and the request router set."""
    configs = copy.deepcopy(args.llm_configs)
    router_cls = ROUTERS[args.routing]
    for cfg in configs:
        loading = cfg.setdefault("model_loading_config", {})
        if loading.get("model_source") == "fixture":
            from fixture_model.build import ensure_model

            loading["model_source"] = str(ensure_model())
        deployment = cfg.setdefault("deployment_config", {})
        if router_cls and "request_router_config" not in deployment:
            deployment["request_router_config"] = {"request_router_class": router_cls}
    return configs


def engine_deployment(llm_config, engine_cores_per_replica: int | None):
    """One model's engine deployment: :class:`EngineServer`, or the ``server_cls`` the model's config names."""
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment

    from .core_binding import EngineServer

    if llm_config.server_cls is not None:  # the user's own server class, as build_openai_app would use it
        if engine_cores_per_replica is not None:
            raise ValueError(f"model {llm_config.model_id!r} names server_cls {llm_config.server_cls!r}; "
                             "engine_cores_per_replica needs the default server class")
        return build_llm_deployment(llm_config)
    # name_prefix keeps Serve's deployment name ("LLMServer:<model>") that dashboards and the monitor know
    return build_llm_deployment(llm_config, deployment_cls=EngineServer, name_prefix="LLMServer:",
                                bind_kwargs={"engine_cores_per_replica": engine_cores_per_replica})


def build_app(args: dict[str, Any]):
    """Build the Serve application graph: FuzzRouter (guarded) -> one LLMServer deployment per model."""
    from ray import serve
    from ray.llm._internal.common.dict_utils import maybe_apply_llm_deployment_config_defaults
    from ray.llm._internal.serve.core.configs.openai_api_models import to_model_metadata
    from ray.llm._internal.serve.core.ingress.ingress import init, make_fastapi_ingress
    from ray.serve.llm import LLMConfig

    from starlette.exceptions import HTTPException

    from .guard import RequestGuard
    from .router import ENDPOINTS, FuzzRouter, openai_http_error

    parsed = FuzzServeArgs.model_validate(args)
    llm_configs = [LLMConfig.model_validate(c) for c in resolve_llm_configs(parsed)]
    if len({c.model_id for c in llm_configs}) != len(llm_configs):
        raise ValueError("model ids must be unique across llm_configs")
    if parsed.ingress == "direct":
        from .direct_server import build_direct

        if len(llm_configs) != 1 or parsed.ingress_deployment_config:
            raise ValueError("ingress: direct serves exactly one model and has no router deployment to configure")
        return build_direct(llm_configs[0], parsed.guard, parsed.engine_cores_per_replica)

    app = init()  # OpenAiIngress's FastAPI app: error handling, CORS, metrics, request ids
    app.add_middleware(RequestGuard, config=parsed.guard)  # added last = runs first
    app.add_exception_handler(HTTPException, openai_http_error)
    ingress_cls = make_fastapi_ingress(FuzzRouter, endpoint_map=ENDPOINTS, app=app)
    options = maybe_apply_llm_deployment_config_defaults(FuzzRouter.get_deployment_options(llm_configs),
                                                         parsed.ingress_deployment_config)
    return serve.deployment(ingress_cls, **options).bind(
        llm_deployments={c.model_id: engine_deployment(c, parsed.engine_cores_per_replica) for c in llm_configs},
        model_cards={c.model_id: to_model_metadata(c.model_id, c) for c in llm_configs},
        lora_paths={c.model_id: c.lora_config.dynamic_lora_loading_path for c in llm_configs
                    if c.lora_config is not None},
    )
