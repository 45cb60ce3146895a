"""The request routers an app can pick (``routing:`` in the YAML), by name: one definition for the builder and
the CLIs.

No Ray import here (the load-test CLI offers the names without paying for one);
the fuzz-aware router itself is :class:`serve_app.routing.fuzz_router.FuzzAffinityRouter`.
"""

from __future__ import annotations

from typing import Literal

Routing = Literal["power_of_two", "round_robin", "prefix_affinity", "fuzz_affinity"]
# routing name -> the engine deployment's request_router_config
ROUTERS: dict[Routing, dict[str, str]] = {
    "power_of_two": {},  # Serve's default RequestRouterConfig
    "round_robin": {"request_router_class": "ray.serve.experimental.round_robin_router.RoundRobinRouter"},
    "prefix_affinity": {"request_router_class": "ray.serve.llm.request_router.PrefixCacheAffinityRouter"},
    "fuzz_affinity": {"request_router_class": "serve_app.routing.fuzz_router.FuzzAffinityRouter"},
}
# Routers that decide on the request body (on the direct path they need it forwarded).
BODY_AWARE: frozenset[Routing] = frozenset({"prefix_affinity", "fuzz_affinity"})
