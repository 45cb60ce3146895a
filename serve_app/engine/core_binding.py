"""Per-replica CPU cores for the engines' OpenMP threads (builder argument ``engine_cores_per_replica``).

Why: on a CPU host vLLM pins each engine's OpenMP (model compute) threads
to the cores named by ``VLLM_CPU_OMP_THREADS_BIND`` in the environment of
its worker process. Every replica of a deployment gets the same
environment (the app's ``runtime_env``), so with vLLM's default ``auto``
all replicas on a node compute on the same cores and contend for them,
and a fixed list in ``runtime_env`` would pin them all to the same cores
too (vLLM reads the variable per process and knows nothing of other
replicas: ``vllm/utils/ompmultiprocessing.py``, ``_parse_omp_threads_bind_env``,
https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/utils/ompmultiprocessing.py).
Binding each replica to its own cores needs a value per replica, which
only the replica knows: Serve gives each replica a rank on its node
(``ReplicaRank.local_rank``, 0, 1, ... per deployment and
node, a freed rank reused by the next replica started).

What: with ``engine_cores_per_replica: k`` the replica with local rank
``r`` sets ``VLLM_CPU_OMP_THREADS_BIND`` to the ``k`` cores of slot
``r mod (n // k)`` of the ``n`` cores its process may run on, before its
engine starts (the engine's processes inherit the environment). Ranks
beyond the number of slots wrap around and share cores, with a warning:
a replica never fails to start over a performance setting. Unset, vLLM's
own ``auto`` applies, unchanged.

The replica also pins its engine's EngineCore process (every thread of it)
to the same cores once the engine has started. With the ``cpu_inproc``
patch (on by default) EngineCore runs the model itself, and its other
threads (ZMQ input and output, Python helpers) would otherwise float onto
the cores kept for the replica's own process (HTTP, tokenizing,
streaming) and for Serve. With ``cpu_inproc`` off, EngineCore and its
worker process take turns (on CPU vLLM runs each step synchronously: it
turns async scheduling off there), so sharing the engine's cores costs
them nothing either. The replica's own process is never pinned.

When Serve renumbers the replicas (after a scale-down it reassigns local
ranks to keep them contiguous, and tells each replica whose rank changed
through ``reconfigure(user_config, rank=...)``), the replica re-pins its
running engine, EngineCore and the processes under it, to the cores of its
new rank (:meth:`EngineServer.reconfigure`). Without that, a 4 -> 1 -> 2
scale left both engines on core 1 and core 0 idle (seen in the scale run:
the survivor, rank 1 renumbered 0, kept core 1; the new replica got rank 1).

Limits: ranks are per deployment, so two models' deployments on one node
start at the same cores. A re-pinned engine's threads share its cores'
set (vLLM's own binding at start puts each OpenMP thread on one core of it;
with one core per replica the two are the same).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ray.serve.llm import LLMServer

from serve_app.engine.cpu_cores import (  # noqa: F401 -- re-exported: the binding's names, where the docs say they are
    BIND_ENV,
    ENGINE_CORE_NAME,
    bind_engine_threads,
    pin_engine_cores,
    replica_cores,
    switch_patch_off,
)
from serve_app.ray_internals import llm_usage_telemetry_wanted, require_start_engine

log = logging.getLogger("ray.serve")
require_start_engine(LLMServer)


class EngineServer(LLMServer):
    """``LLMServer`` whose engine binds to this replica's own cores when ``engine_cores_per_replica`` is set,
    and whose engine processes spin instead of nap while waiting for each other when ``shm_wait`` is False."""

    # Serve awaits an async constructor (LLMServer's own is one); mypy knows only the synchronous kind.
    async def __init__(  # type: ignore[misc]
        self, llm_config, *, engine_cores_per_replica: int | None = None, shm_wait: bool = True, **kwargs
    ):
        if not shm_wait:  # before the engine starts: its processes inherit this environment
            log.info("shm_wait: false; this replica's engine runs with %s", switch_patch_off("shm_wait"))
        value = None
        self._engine_cores_per_replica = engine_cores_per_replica
        self._local_rank: int | None = None  # the rank the engine is bound for
        if engine_cores_per_replica is not None:
            from ray import serve

            rank = serve.get_replica_context().rank
            self._local_rank = None if rank is None else rank.local_rank
            value = bind_engine_threads(engine_cores_per_replica, self._local_rank)
        await super().__init__(llm_config, **kwargs)
        if value is not None:
            pids = pin_engine_cores({int(c) for c in value.split(",")})
            if pids:
                log.info("EngineCore %s pinned to cores %s", pids, value)
            else:  # vLLM renamed or moved its engine process: the binding still holds for the model threads
                log.warning("no %s child process found; EngineCore not pinned to cores %s", ENGINE_CORE_NAME, value)

    async def _start_engine(self) -> None:
        """The engine started as ``LLMServer`` starts it, without Ray Serve LLM's usage-telemetry report (and the
        detached actor process it creates) when usage stats are off: :func:`serve_app.ray_internals.
        llm_usage_telemetry_wanted` says why, and how to switch it back for an A/B run."""
        if llm_usage_telemetry_wanted():
            await super()._start_engine()
            return
        if self.engine is None:
            raise ValueError("Engine is not set")
        await self.engine.start()

    def reconfigure(self, user_config: Any = None, rank: Any = None) -> None:
        """Serve's hook (it passes ``rank`` because this method takes one): when Serve gives this replica another
        local rank, re-pin the running engine to the cores of that rank."""
        new = getattr(rank, "local_rank", None)
        cores_per_replica = getattr(self, "_engine_cores_per_replica", None)  # None too before __init__ ran
        if cores_per_replica is None or new is None or new == self._local_rank:
            return
        cores, shared = replica_cores(new, cores_per_replica, os.sched_getaffinity(0))
        pids = pin_engine_cores(set(cores), with_workers=True)
        log.info(
            "replica local rank %s -> %d (Serve renumbered its replicas): EngineCore %s re-pinned to cores %s%s",
            self._local_rank,
            new,
            pids,
            ",".join(map(str, cores)),
            " (shared)" if shared else "",
        )
        self._local_rank = new
