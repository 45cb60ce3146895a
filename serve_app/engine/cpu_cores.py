"""Which cores an engine replica's engine runs on, without importing Ray (the binding's arithmetic and the pinning).

Split from :mod:`serve_app.engine.core_binding` (which holds the replica class and
imports ``ray.serve.llm``) so that tools which only need the arithmetic (the
benchmarks' ``engine`` arm pins a plain vLLM server the way a rank-0 replica
is pinned) do not import Ray Serve, which reconfigures the importing
process's logging. Why and how the binding works: :mod:`serve_app.engine.core_binding`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection
from typing import Any

import psutil

from patches.framework.switches import OFF_ENV, with_patch_off

log = logging.getLogger("ray.serve")

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# vLLM titles its engine process "VLLM::EngineCore" ("VLLM::EngineCore_DP<n>"
# with data parallelism) through setproctitle; the kernel keeps 15 characters of
# it (comm), psutil's name() the whole title where it can read it.
ENGINE_CORE_NAME = "VLLM::EngineCore"[:15]


def replica_cores(local_rank: int, cores_per_replica: int, allowed: Collection[int]) -> tuple[list[int], bool]:
    """The cores of the replica with ``local_rank``, and whether it shares them (more ranks than slots)."""
    if cores_per_replica < 1:
        raise ValueError(f"engine_cores_per_replica must be >= 1, got {cores_per_replica}")
    if local_rank < 0:
        raise ValueError(f"local rank must be >= 0, got {local_rank}")
    cores = sorted(set(allowed))
    if cores_per_replica > len(cores):
        raise ValueError(
            f"engine_cores_per_replica={cores_per_replica} but this process may use only {len(cores)} cores ({cores})"
        )
    slots = len(cores) // cores_per_replica
    slot = local_rank % slots
    return cores[slot * cores_per_replica : (slot + 1) * cores_per_replica], local_rank >= slots


def bind_engine_threads(
    cores_per_replica: int, local_rank: int | None, environ: dict[str, str] | Any = os.environ
) -> str | None:
    """Set ``VLLM_CPU_OMP_THREADS_BIND`` in ``environ`` for this replica; the value set, or None."""
    if local_rank is None:  # Serve always passes a rank to a replica it starts; do not guess
        log.warning(
            "engine_cores_per_replica=%d: this replica has no rank; vLLM's %s=%s applies",
            cores_per_replica,
            BIND_ENV,
            environ.get(BIND_ENV, "auto"),
        )
        return None
    cores, shared = replica_cores(local_rank, cores_per_replica, os.sched_getaffinity(0))
    value = ",".join(map(str, cores))
    if shared:
        log.warning(
            "replica local rank %d: more replicas than %d-core slots on this node; sharing cores %s",
            local_rank,
            cores_per_replica,
            value,
        )
    if environ.get(BIND_ENV) not in (None, value):
        log.warning("engine_cores_per_replica overrides %s=%s from the environment", BIND_ENV, environ[BIND_ENV])
    environ[BIND_ENV] = value
    log.info("replica local rank %d: engine OpenMP threads bound to cores %s", local_rank, value)
    return value


def pin_threads(proc: psutil.Process, cores: Collection[int]) -> None:
    """Pin every thread of ``proc`` to ``cores`` (the kernel keeps one CPU mask per thread; threads it starts
    later inherit the mask of the thread that starts them). A thread that ends meanwhile is skipped."""
    for thread in proc.threads():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(thread.id, cores)


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
                pin_threads(proc, cores)
        except psutil.NoSuchProcess:
            continue
        pinned.append(child.pid)
    return pinned


def switch_patch_off(name: str, environ: dict[str, str] | Any = os.environ) -> str:
    """Add patch ``name`` to ``FUZZSERVE_PATCHES_OFF`` in ``environ`` (kept as is when it says ``all``); the value."""
    environ[OFF_ENV] = with_patch_off(name, environ.get(OFF_ENV))
    return environ[OFF_ENV]
