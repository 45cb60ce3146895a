"""The ``cpu_inproc`` patch's decisions (patches/cpu_inproc.py): pure logic, no engine.

That a patched engine really runs its model in EngineCore, with upstream's
OpenMP environment, is checked on real engines in tests/test_plugin.py
(``test_cpu_inproc_runs_the_model_in_engine_core``).
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from vllm.config import ParallelConfig
from vllm.v1.engine import utils as engine_utils
from vllm.v1.executor.multiproc_executor import MultiprocExecutor
from vllm.v1.executor.uniproc_executor import UniProcExecutor

from patches.cpu_inproc import OMP_ENV, engine_core_omp_env, runs_in_process

CPU = SimpleNamespace(is_cpu=lambda: True)
GPU = SimpleNamespace(is_cpu=lambda: False)


@pytest.mark.parametrize(
    ("backend", "tp", "dp", "multiprocessing", "expected"),
    [
        ("mp", 1, 1, True, True),  # Ray Serve LLM's choice on CPU replicas
        ("uni", 1, 1, True, True),  # upstream would turn it into mp
        ("mp", 1, 1, False, False),  # EngineCore in the caller's process: upstream keeps uni there itself
        ("mp", 2, 1, True, False),  # several workers need the ring
        ("mp", 1, 2, True, False),  # data parallel: several EngineCores on one host
        ("ray", 1, 1, True, False),  # other backends are the user's choice
        ("external_launcher", 1, 1, True, False),
    ],
)
def test_only_one_worker_engines_with_their_own_engine_core_run_in_it(
    monkeypatch, backend, tp, dp, multiprocessing, expected
):
    # ParallelConfig(external_launcher) sets os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" for the whole
    # process; unguarded, every engine and Ray cluster the session starts later inherits it (it did, in CI).
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp, distributed_executor_backend=backend)
    assert runs_in_process(parallel, multiprocessing) is expected


def omp_env() -> dict[str, str | None]:
    return {k: os.environ.get(k) for k in OMP_ENV}


def test_a_uniproc_engine_core_on_cpu_is_spawned_with_the_worker_omp_env(monkeypatch):
    for key in OMP_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(engine_utils, "current_platform", CPU)
    config = SimpleNamespace(parallel_config=ParallelConfig(), kv_transfer_config=None)
    with engine_core_omp_env(config, UniProcExecutor):
        inside = omp_env()
    assert inside["OMP_NUM_THREADS"], f"no OpenMP environment set for the spawn: {inside}"
    assert omp_env() == dict.fromkeys(OMP_ENV), "the environment outlived the spawn"


def test_a_multiproc_engine_core_keeps_upstream_env(monkeypatch):
    monkeypatch.setattr(engine_utils, "current_platform", CPU)
    # No config attribute is read and nothing is set: the worker process sets its own environment, as upstream does.
    before = omp_env()
    with engine_core_omp_env(SimpleNamespace(), MultiprocExecutor):
        assert omp_env() == before


def test_the_platform_is_the_one_the_wrapped_manager_consults(monkeypatch):
    """Upstream's test_startup_watch_processes.py swaps engine_utils.current_platform for a GPU-like stand-in
    and hands CoreEngineProcManager a stand-in config; the patch must then do what upstream does (nothing)
    and read nothing from the config. It once consulted vllm.platforms.current_platform (the real CPU here)
    and failed those six upstream tests with AttributeError (docs/upstream_tests.md)."""
    monkeypatch.setattr(engine_utils, "current_platform", GPU)
    with engine_core_omp_env(SimpleNamespace(), UniProcExecutor):
        pass
    monkeypatch.setattr(engine_utils, "current_platform", CPU)
    with pytest.raises(AttributeError):  # the bad case: on CPU the stand-in config is read
        engine_core_omp_env(SimpleNamespace(), UniProcExecutor)
