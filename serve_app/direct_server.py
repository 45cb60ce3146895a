"""The fast path: Ray's direct streaming, with the fuzz router's checks inside each engine replica.

With ``ingress: direct`` (builder argument) the app has no separate router
deployment. Ray Serve's HAProxy asks ``ray.serve.llm``'s ``LLMRouter`` which
replica should take a request (through the engine deployment's request
router), then forwards the HTTP connection straight to that replica, where
vLLM's own FastAPI app answers. That removes a hop and a Python ingress from
every request and every streamed chunk: the lever FACTS.md measured at 3.5x
the default path's throughput on this machine.

What would be lost, the router's checks, moves into the replica:
:class:`FuzzServer` is ``LLMServer`` with :class:`serve_app.guard.RequestGuard`
installed outermost on the vLLM app it builds, so API keys, body limits and
the ``vllm_xargs`` policy are enforced on the replica's port, which
HAProxy mode binds on all interfaces.

Requirements: the cluster runs Serve's HAProxy (``RAY_SERVE_ENABLE_HA_PROXY=1``
in the environment of ``ray start``), one model per app (Ray's limit).
The router's ``/ready`` does not exist here; vLLM's ``/health`` does.
"""

from __future__ import annotations

from typing import Any

from ray.llm._internal.serve.core.server.llm_server import _add_middleware_to_built_app

from .core_binding import EngineServer
from .guard import GuardConfig, RequestGuard


class FuzzServer(EngineServer):
    async def __init__(self, llm_config, *, guard: dict[str, Any] | None = None, **kwargs):
        self._guard_config = GuardConfig.model_validate(guard or {})
        await super().__init__(llm_config, **kwargs)

    async def __serve_build_asgi_app__(self):
        app = await super().__serve_build_asgi_app__()
        _add_middleware_to_built_app(app, RequestGuard, config=self._guard_config)
        return app


def build_direct(llm_config, guard: GuardConfig, engine_cores_per_replica: int | None = None):
    """The direct-streaming application graph: FuzzServer as the ingress, LLMRouter picking replicas."""
    from ray.llm._internal.serve.core.ingress.builder import (
        _build_direct_streaming_llm_deployment,
        _build_openai_ingress_request_router,
    )

    server = _build_direct_streaming_llm_deployment(llm_config, deployment_cls=FuzzServer,
                                                    bind_kwargs={"guard": guard.model_dump(),
                                                                 "engine_cores_per_replica": engine_cores_per_replica})
    return server._with_ingress_request_router(
        _build_openai_ingress_request_router(server=server, llm_config=llm_config))
