"""Fuzz-aware prefix-affinity request routing.

Ray's ``PrefixCacheAffinityRouter`` sends a request to the replica that has
seen the longest prefix of its prompt, to reuse that replica's prefix cache.
With fuzz, two requests with the same prompt but different fuzz settings can
*not* share KV (the engine salts the cache per setting, see
``patches.fuzz``), so matching them on the prompt alone sends a request to a
replica whose cache cannot help it, and crowds requests with different
settings onto one replica.

:class:`FuzzAffinityRouter` keys the prefix tree on ``salt + prompt``, where
the salt is the one the engine will use (``FuzzSpec.cache_salt``): requests
match only where the engine could reuse the KV. Everything else (load
balancing fallback, eviction, locality) is Ray's.

Selected with ``routing: fuzz_affinity`` in the app's arguments (what
``serve_config.yaml`` ships); ``prefix_affinity`` selects Ray's router
unchanged, ``power_of_two`` (the default) Serve's default router,
``round_robin`` Ray's direct-streaming default. On the direct path the
engine deployment's request router is asked by ``LLMRouter`` with the
request body (``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1``), as a
namespace whose attributes are the body's fields; on the router path with
the parsed request. Both expose ``prompt`` / ``messages`` and ``vllm_xargs``.
"""

from __future__ import annotations

from typing import Any, Literal

from ray.serve.llm.request_router import PrefixCacheAffinityRouter

from patches.fuzz_params import parse_or_neutral

Routing = Literal["power_of_two", "round_robin", "prefix_affinity", "fuzz_affinity"]
# routing name -> the engine deployment's request_router_config
ROUTERS: dict[str, dict[str, str]] = {
    "power_of_two": {},  # Serve's default RequestRouterConfig
    "round_robin": {"request_router_class": "ray.serve.experimental.round_robin_router.RoundRobinRouter"},
    "prefix_affinity": {"request_router_class": "ray.serve.llm.request_router.PrefixCacheAffinityRouter"},
    "fuzz_affinity": {"request_router_class": "serve_app.routing.FuzzAffinityRouter"},
}
# Routers that decide on the request body (on the direct path they need it forwarded).
BODY_AWARE = frozenset({"prefix_affinity", "fuzz_affinity"})


def affinity_key(text: str, vllm_xargs: Any) -> str:
    """The prefix-tree key of a request: its prompt text behind its fuzz cache salt."""
    spec, _error = parse_or_neutral(vllm_xargs if isinstance(vllm_xargs, dict) else None)
    salt = spec.cache_salt()
    return text if salt is None else f"\x00{salt}\x00{text}"


class FuzzAffinityRouter(PrefixCacheAffinityRouter):
    def _extract_text_from_request(self, pending_request) -> str:
        text = super()._extract_text_from_request(pending_request)
        for arg in pending_request.args:
            if hasattr(arg, "prompt") or hasattr(arg, "messages"):
                return affinity_key(text, getattr(arg, "vllm_xargs", None))
        return text
