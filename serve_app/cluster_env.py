"""The environment every Ray node of a deployment starts with (``ray start``): one table, read by all.

Ray Serve reads these in the processes ``ray start`` spawns (its controller,
its proxy and HAProxy, the replicas), so they must be in the environment of
``ray start`` itself on every node; the application's ``runtime_env`` is
too late for the controller and the proxy. ``scripts/env.sh`` exports them
(``python -m serve_app.cluster_env`` prints the ``export`` lines it
evaluates, and makes Ray's auth token where one is needed: :func:`ensure_auth_token`),
:class:`serve_app.local_cluster.LocalCluster` sets them for the
clusters the tests, benchmarks and load tests start, and the app builder
refuses the direct path without the first two (:func:`serve_app.app.require_haproxy`).
A value already in the environment wins everywhere (e.g.
``RAY_SERVE_ENABLE_HA_PROXY=0`` to opt out).

=====================================================  =====  ==================================================
variable                                               value  why
=====================================================  =====  ==================================================
``RAY_SERVE_ENABLE_HA_PROXY``                          1      Serve's HAProxy: the direct-streaming path that
                                                              ``ingress: direct`` (the shipped config) needs
``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY``      1      HAProxy hands the request body to the ingress
                                                              request router, so fuzz_affinity sees the prompt
                                                              and the fuzz settings
``RAY_SERVE_CONTROL_LOOP_INTERVAL_S``                  0.5    Serve's controller reconciles every 0.5 s
                                                              instead of 0.1 s: measured on a 2-core host, its
                                                              idle CPU falls from 3.1 % to 1.1 % of a core, and
                                                              the Ray processes' CPU per request under load by a
                                                              quarter (docs/serve.md#what-the-cluster-costs-idle);
                                                              health checks and autoscaling keep their own
                                                              periods, state changes are seen up to 0.4 s later
``RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE``   65536  HAProxy forwards at most 64 KiB of a body to the
                                                              ingress request router (Serve's default: 8 MiB),
                                                              which runs before any API key is checked; a longer
                                                              body is routed on load (serve_app/ingress_router.py,
                                                              docs/security.md)
``RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE``         2      two ingress request routers per proxy node (Serve's
                                                              default: 1). A redeploy replaces the router too;
                                                              with one, HAProxy's router pool named only the
                                                              stopping one until the new one was pushed, and a
                                                              request in that gap got 503 "Ingress request router
                                                              failed: router_unreachable" (1 of 24086 in a
                                                              redeploy at 256 streams: docs/load_tests.md). With
                                                              two, HAProxy moves on to the other when a connection
                                                              fails (fewer such refusals, not none: see
                                                              docs/load_tests.md#refused-at-the-ingress). Each
                                                              costs no CPU reservation, one process
``RAY_AUTH_MODE``                                      token  Ray 2.60's token authentication, on: ``ray start``,
                                                              ``serve`` and ``ray.init`` must agree on the mode
                                                              (a ``serve deploy`` that believes auth is off fails
                                                              with "Missing authentication token")
the engine environment (:mod:`serve_app.engine_env`)   ...    what every vLLM engine of the project runs with
=====================================================  =====  ==================================================
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .engine_env import ENGINE_ENV

HAPROXY = "RAY_SERVE_ENABLE_HA_PROXY"
FORWARD_BODY = "RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY"
# Serve's HAProxy, and the body forwarded to the ingress request router, in the order require_haproxy checks them.
HAPROXY_ENV = (HAPROXY, FORWARD_BODY)
AUTH_MODE = "RAY_AUTH_MODE"
AUTH_TOKEN = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN_PATH"
CLUSTER_ENV: dict[str, str] = {
    HAPROXY: "1",
    FORWARD_BODY: "1",
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5",
    "RAY_SERVE_HAPROXY_INGRESS_REQUEST_ROUTER_BUFSIZE": str(64 * 1024),
    "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE": "2",
    AUTH_MODE: "token",
    **ENGINE_ENV,
}
BIN = Path(sys.executable).parent


def with_cluster_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with every :data:`CLUSTER_ENV` variable it does not set itself."""
    return {**CLUSTER_ENV, **env}


def exports() -> str:
    """Shell ``export`` lines for :data:`CLUSTER_ENV`, keeping a value the shell already has."""
    return "\n".join(f"export {k}=${{{k}:-{shlex.quote(v)}}}" for k, v in CLUSTER_ENV.items())


def ensure_auth_token(env: Mapping[str, str]) -> None:
    """Create Ray's token file when token auth is on and no token exists (what ``ray.init`` does itself).

    ``ray start`` refuses to start a token-auth cluster without a token, and
    does not create one.
    """
    if env.get(AUTH_MODE, "").lower() != "token" or env.get(AUTH_TOKEN):
        return
    path = Path(env.get(AUTH_TOKEN_PATH) or Path.home() / ".ray" / "auth_token")
    if not path.exists():
        subprocess.run([str(BIN / "ray"), "get-auth-token", "--generate"], env=dict(env), check=True,
                       capture_output=True, timeout=120)


def main() -> int:
    """Print the export lines (for ``eval``); first make the auth token the exported environment needs."""
    ensure_auth_token(with_cluster_env(os.environ))
    sys.stdout.write(exports() + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
