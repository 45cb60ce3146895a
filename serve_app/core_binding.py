"""Per-replica CPU cores for the engines' OpenMP threads (builder argument ``engine_cores_per_replica``).

Why: on a CPU host vLLM pins each engine's OpenMP (model compute) threads
to the cores named by ``VLLM_CPU_OMP_THREADS_BIND`` in the environment of
its worker process. Every replica of a deployment gets the same
environment (the app's ``runtime_env``), so with vLLM's default ``auto``
all replicas on a node compute on the same cores and contend for them,
and a fixed list in ``runtime_env`` would pin them all to the same cores
too (vLLM reads the variable per process and knows nothing of other
replicas: ``vllm/utils/ompmultiprocessing.py``, ``_parse_omp_threads_bind_env``,
https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/utils/ompmultiprocessing.py). Binding each replica to its own cores needs a value per
replica, which only the replica knows: Serve gives each replica a rank
on its node (``ReplicaRank.local_rank``, 0, 1, ... per deployment and
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
from collections.abc import Collection, Sequence
from typing import Any

import psutil
from ray.serve.llm import LLMServer

from patches.switches import OFF_ENV, with_patch_off

log = logging.getLogger("ray.serve")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# vLLM titles its engine process "VLLM::EngineCore" ("VLLM::EngineCore_DP<n>"
# with data parallelism) through setproctitle; the kernel keeps 15 characters of
# it (comm), psutil's name() the whole title where it can read it.
ENGINE_CORE_NAME = "VLLM::EngineCore"[:15]


def replica_cores(local_rank: int, cores_per_replica: int, allowed: Sequence[int]) -> tuple[list[int], bool]:
    """The cores of the replica with ``local_rank``, and whether it shares them (more ranks than slots)."""
    if cores_per_replica < 1:
        raise ValueError(f"engine_cores_per_replica must be >= 1, got {cores_per_replica}")
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    cores = sorted(set(allowed))
    if cores_per_replica > len(cores):
        raise ValueError(f"engine_cores_per_replica={cores_per_replica} but this process may use only "
                         f"{len(cores)} cores ({cores})")
    slots = len(cores) // cores_per_replica
    slot = local_rank % slots
    return cores[slot * cores_per_replica:(slot + 1) * cores_per_replica], local_rank >= slots


def bind_engine_threads(cores_per_replica: int, local_rank: int | None,
                        environ: dict[str, str] | Any = os.environ) -> str | None:
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` in ``environ`` for this replica; the value set, or None."""
    if local_rank is None:  # Serve always passes a rank to a replica it starts; do not guess
        log.warning("engine_cores_per_replica=%d: this replica has no rank; vLLM's %s=%s applies",
                    cores_per_replica, BIND_ENV, environ.get(BIND_ENV, "auto"))
        return None
    cores, shared = replica_cores(local_rank, cores_per_replica, os.sched_getaffinity(0))
    value = ",".join(map(str, cores))
    if shared:
        log.warning("replica local rank %d: more replicas than %d-core slots on this node; sharing cores %s",
                    local_rank, cores_per_replica, value)
    if environ.get(BIND_ENV) not in (None, value):
        log.warning("engine_cores_per_replica overrides %s=%s from the environment", BIND_ENV, environ[BIND_ENV])
    environ[BIND_ENV] = value
    log.info("replica local rank %d: engine OpenMP threads bound to cores %s", local_rank, value)
    return value


def pin_engine_cores(cores: Collection[int], parent_pid: int | None = None, with_workers: bool = False) -> list[int]:
    """Pin every thread of each EngineCore child of ``parent_pid`` (this process) to ``cores``; their pids.

    Per thread, because the kernel keeps one CPU mask per thread and a
    process's threads already run when the engine has started; threads it
    starts later inherit the mask of the thread that starts them.
    ``with_workers``: the processes under each EngineCore too (a re-bind:
    with ``cpu_inproc`` off the model runs in EngineCore's worker, which
    ``VLLM_CPU_OMP_THREADS_BIND`` bound at start).
    """
    pinned = []
    for child in psutil.Process(parent_pid).children():
        try:
            if not child.name().startswith(ENGINE_CORE_NAME):
                continue
            procs = [child, *child.children(recursive=True)] if with_workers else [child]
            for proc in procs:
                for thread in proc.threads():
                    try:
                        os.sched_setaffinity(thread.id, cores)
                    except ProcessLookupError:  # the thread ended meanwhile
                        pass
        except psutil.NoSuchProcess:
            continue
        pinned.append(child.pid)
    return pinned


def switch_patch_off(name: str, environ: dict[str, str] | Any = os.environ) -> str:
    """Add patch ``name`` to ``FUZZSERVE_PATCHES_OFF`` in ``environ`` (kept as is when it says ``all``); the value."""
    environ[OFF_ENV] = with_patch_off(name, environ.get(OFF_ENV))
    return environ[OFF_ENV]


class EngineServer(LLMServer):
    """``LLMServer`` whose engine binds to this replica's own cores when ``engine_cores_per_replica`` is set,
    and whose engine processes spin instead of nap while waiting for each other when ``shm_wait`` is False."""

    async def __init__(self, llm_config, *, engine_cores_per_replica: int | None = None, shm_wait: bool = True,
                       **kwargs):
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

    def reconfigure(self, user_config: Any = None, rank: Any = None) -> None:
        """Serve's hook (it passes ``rank`` because this method takes one): when Serve gives this replica another
        local rank, re-pin the running engine to the cores of that rank."""
        new = getattr(rank, "local_rank", None)
        cores_per_replica = getattr(self, "_engine_cores_per_replica", None)  # None too before __init__ ran
        if cores_per_replica is None or new is None or new == self._local_rank:
            return
        cores, shared = replica_cores(new, cores_per_replica, os.sched_getaffinity(0))
        pids = pin_engine_cores(set(cores), with_workers=True)
        log.info("replica local rank %s -> %d (Serve renumbered its replicas): EngineCore %s re-pinned to cores %s%s",
                 self._local_rank, new, pids, ",".join(map(str, cores)), " (shared)" if shared else "")
        self._local_rank = new
