"""What the guard does with each HTTP route an engine replica (or the router path's ingress) serves.

Every route of the app is in :data:`ROUTES` with one of four policies, and
the guard (:mod:`serve_app.ingress.guard`) refuses any path that is not switched on
with a 404, whatever the app behind it would do:

* ``open``: answered without an API key (liveness and readiness probes);
* ``read``: API key, no body (model list, metrics);
* ``checked``: API key, and the JSON body through the request policy
  (:mod:`serve_app.ingress.xargs_policy`: ``vllm_xargs``, reserved engine keys,
  caps on expensive parameters) before the app reads it; every route whose
  body builds sampling parameters is ``checked``;
* ``refused``: never served, even if listed in ``guard.routes``: routes that
  hand a client the engine's internals (token-in generation with raw
  sampling parameters, KV events, elastic scaling, prompt rendering), read
  or cancel other clients' stored responses, or document the app.

Which routes are on is ``guard.routes`` in the YAML (:data:`DEFAULT_ROUTES`:
the OpenAI generate routes, the model list, the probes, metrics). Why a
table and not a list of checked routes: vLLM adds routes between versions
(0.32 serves 36 on a generate model); a route nobody decided about must not
be reachable. :func:`unreviewed` lists the routes of a built app that the
table does not know, and the replica refuses to start with them
(:mod:`serve_app.engine.direct_server`), so a vLLM upgrade that adds a route fails
loudly at deploy, naming it, instead of serving it unchecked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from starlette.routing import compile_path

Policy = Literal["open", "read", "checked", "refused"]


@dataclass(frozen=True)
class Route:
    path: str  # as the app declares it (Starlette path syntax, e.g. /v1/models/{model:path})
    policy: Policy
    why: str
    batch: bool = False  # the body carries several requests (``messages`` is a list of conversations)
    generates: bool = False  # the body asks the engine for tokens (counted by the guard's admitted-request counter)

    @property
    def regex(self) -> re.Pattern:
        return compile_path(self.path)[0]


_GEN = "builds sampling parameters from the body"
ROUTES: tuple[Route, ...] = (
    # generate: the body builds SamplingParams (vllm_xargs, kv_transfer_params, n, beam search, grammars)
    Route("/v1/completions", "checked", _GEN, generates=True),
    Route("/v1/chat/completions", "checked", _GEN, generates=True),
    Route("/v1/chat/completions/batch", "checked", _GEN + ", one set per conversation", batch=True, generates=True),
    Route("/v1/responses", "checked", _GEN + " (OpenAI Responses API)", generates=True),
    Route("/v1/messages", "checked", _GEN + " (Anthropic Messages API)", generates=True),
    Route("/invocations", "checked", _GEN + " (SageMaker: dispatched on the body to one of the above)", generates=True),
    Route("/v1/messages/count_tokens", "checked", "tokenizes a Messages body"),
    Route("/tokenize", "checked", "tokenizes a prompt or messages"),
    Route("/detokenize", "checked", "detokenizes token ids"),
    # reads
    Route("/v1/models", "read", "the model list"),
    Route("/v1/models/{model:path}", "read", "one model's card"),
    Route("/metrics", "read", "the replica's Prometheus metrics (vLLM's app)"),
    Route("/version", "read", "vLLM's version"),
    Route("/load", "read", "the server's in-flight request count"),
    # probes
    Route("/health", "open", "liveness: the engine is alive"),
    Route("/ready", "open", "readiness: the model has a serving replica"),
    Route("/ping", "open", "SageMaker's liveness probe"),
    # never: internals, other clients' data, documentation
    Route("/inference/v1/generate", "refused", "token-in generation: raw sampling parameters, extra_args included"),
    Route("/inference/v1/abort_requests", "refused", "aborts any request by id"),
    Route("/v1/responses/{response_id}", "refused", "reads a stored response by id: any client's"),
    Route("/v1/responses/{response_id}/cancel", "refused", "cancels a stored response by id: any client's"),
    Route("/kv_event_sources", "refused", "the engine's KV event endpoints"),
    Route("/scale_elastic_ep", "refused", "rescales expert parallelism"),
    Route("/is_scaling_elastic_ep", "refused", "elastic expert parallelism state"),
    Route("/v1/chat/completions/render", "refused", "renders prompts (disaggregated serving internals)"),
    Route("/v1/completions/render", "refused", "renders prompts (disaggregated serving internals)"),
    Route("/v1/messages/render", "refused", "renders prompts (disaggregated serving internals)"),
    Route("/v1/responses/render", "refused", "renders prompts (disaggregated serving internals)"),
    Route("/v1/chat/completions/derender", "refused", "derenders tokens (disaggregated serving internals)"),
    Route("/v1/completions/derender", "refused", "derenders tokens (disaggregated serving internals)"),
    Route("/generative_scoring", "refused", "scores continuations; no policy written for its body"),
    Route("/v1/systemone", "refused", "no policy written for its body"),
    Route("/v1/embeddings", "refused", "pooling: not served by a generate model"),
    Route("/v1/score", "refused", "pooling: not served by a generate model"),
    Route("/v1/audio/transcriptions", "refused", "audio: not served by a text model"),
    Route("/openapi.json", "refused", "documents the app"),
    Route("/docs", "refused", "documents the app"),
    Route("/docs/oauth2-redirect", "refused", "documents the app"),
    Route("/redoc", "refused", "documents the app"),
)
BY_PATH = {r.path: r for r in ROUTES}
DEFAULT_ROUTES: tuple[str, ...] = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/v1/models/{model:path}",
    "/metrics",
    "/health",
    "/ready",
    "/ping",
)


class RouteTable:
    """The routes switched on (``guard.routes``), matched against request paths."""

    def __init__(self, enabled: Iterable[str] = DEFAULT_ROUTES):
        enabled = tuple(enabled)
        unknown = [p for p in enabled if p not in BY_PATH]
        if unknown:
            raise ValueError(
                f"guard.routes: unknown route(s) {unknown}; known: {[r.path for r in ROUTES if r.policy != 'refused']}"
            )
        refused = [p for p in enabled if BY_PATH[p].policy == "refused"]
        if refused:
            raise ValueError(
                f"guard.routes: {refused} cannot be switched on: "
                + "; ".join(f"{p}: {BY_PATH[p].why}" for p in refused)
            )
        self.enabled = tuple(BY_PATH[p] for p in enabled)
        self._exact = {r.path: r for r in self.enabled if "{" not in r.path}
        self._templated = [(r.regex, r) for r in self.enabled if "{" in r.path]

    def match(self, path: str) -> Route | None:
        """The enabled route ``path`` falls under, or None (the guard answers 404)."""
        route = self._exact.get(path) or self._exact.get(path.rstrip("/") or "/")
        if route is not None:
            return route
        if path.startswith("/metrics/") and "/metrics" in self._exact:  # vLLM mounts its exporter app there too
            return self._exact["/metrics"]
        for regex, r in self._templated:
            if regex.match(path):
                return r
        return None


def app_paths(app) -> list[str]:
    """Every route path a Starlette/FastAPI app serves (routes and mounts)."""
    return sorted({getattr(r, "path", None) or "" for r in getattr(app, "routes", [])} - {""})


def unreviewed(paths: Iterable[str]) -> list[str]:
    """The paths of an app that :data:`ROUTES` has no policy for."""
    return sorted(p for p in set(paths) if p not in BY_PATH)
