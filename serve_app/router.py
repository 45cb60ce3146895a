"""The HTTP ingress: ``ray.serve.llm``'s ``OpenAiIngress`` with the fuzz router's checks in front.

Work in progress (issue 4): validation of ``vllm_xargs`` at the edge
(``serve_app.xargs_policy``); auth, size limits and fuzz-aware routing are
still to come. Replicas validate fuzz settings themselves too (the plugin's
frontend hook), so a request that reaches a replica by another path is still
checked.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest, CompletionRequest
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress

from .xargs_policy import RequestRejected, XargsPolicy, check_xargs


class FuzzRouter(OpenAiIngress):
    def __init__(self, llm_deployments, *, xargs_policy: dict[str, Any] | None = None, **kwargs):
        super().__init__(llm_deployments, **kwargs)
        self._xargs_policy = XargsPolicy.model_validate(xargs_policy or {})

    def _admit(self, body: Any) -> JSONResponse | None:
        try:
            body.vllm_xargs, _spec = check_xargs(getattr(body, "vllm_xargs", None), self._xargs_policy)
        except RequestRejected as e:
            return JSONResponse(status_code=e.status_code, content=e.body())
        return None

    # FastAPI reads the body's type from these annotations: keep them.
    async def completions(self, body: CompletionRequest, request: Request):
        return self._admit(body) or await super().completions(body, request)

    async def chat(self, body: ChatCompletionRequest, request: Request):
        return self._admit(body) or await super().chat(body, request)
