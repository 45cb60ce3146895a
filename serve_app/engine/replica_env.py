"""Ray Serve's settings for this project's replicas, read from each replica's own environment, in one table.

=================================================  =====  =====================================================
variable                                           value  why
=================================================  =====  =====================================================
``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD``     0      Serve runs the replica's app (the guard, vLLM's
                                                          OpenAI app, ``AsyncLLM``) on the replica's main
                                                          event loop. Ray 2.60's default (1) runs it on a
                                                          loop of its own thread and hands every ASGI message
                                                          of every request across the two loops
                                                          (``call_soon_threadsafe``): per request about 1 ms
                                                          of the replica's CPU at 8 in flight, and on a
                                                          2-core host a wait for the core each time. Ray's
                                                          stuck-loop watchdog, the one thing the thread adds,
                                                          never runs for ``LLMServer`` (it defines its own
                                                          ``check_health``; Serve runs the watchdog only for
                                                          apps without one), so a wedged loop is found as
                                                          before: by the health check's timeout. Ray's
                                                          maintainers mean to make 0 the default
                                                          (ray-project/ray#61226). At the protocol beside the
                                                          thread: the replica's CPU per request 12-20 % lower
                                                          at every load, TTFT p50 0.86x at 8 in flight
                                                          (docs/serve.md#the-replicas-event-loop)
=================================================  =====  =====================================================

``serve_config.yaml`` and ``serve_config.cuda.yaml`` set this table and
:data:`~serve_app.engine.engine_env.ENGINE_ENV` in their application's
``runtime_env`` (:data:`APPLICATION_ENV`; YAML cannot import it,
``tests/test_serve_config.py`` keeps them equal). There, and not in the
cluster's environment (``cluster_env``), it reaches only this application's
replicas: another application on the cluster (the benchmarks' stock peer)
keeps Ray's default. A deployment that leaves it out runs as Ray's default
does, only slower.
"""

from __future__ import annotations

from serve_app.engine.engine_env import ENGINE_ENV

USER_CODE_THREAD = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
REPLICA_ENV: dict[str, str] = {USER_CODE_THREAD: "0"}
# What the shipped configs' application runtime_env sets: every engine's environment, then Serve's for the replica.
APPLICATION_ENV: dict[str, str] = {**ENGINE_ENV, **REPLICA_ENV}
