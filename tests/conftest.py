"""Shared fixtures. Engines are session-scoped: each one starts once per test run.

On 2 cores an engine start costs ~30 s (eager) or ~60 s (compiled), so tests
share them; every engine runs in its own process group and is killed by id at
the end of the session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patches.framework.switches import ALL, OFF_ENV
from serve_app.engine.engine_env import ENGINE_ENV, use_engine_env

# Before any test module imports vLLM or transformers (pytest imports this first).
use_engine_env()

from testkit.engine_host import EngineHost  # noqa: E402
from testkit.serve import SERVE_API_KEY  # noqa: E402

# The marker check (tests/markers.py): its hooks, registered by being names of this conftest.
from tests.markers import (  # noqa: E402
    pytest_configure,  # noqa: F401
)

# Every engine in the tests: small KV space, deterministic, enough context for
# multi-block (128-token blocks on CPU) shared prefixes.
# VLLM_ALLOW_INSECURE_SERIALIZATION lets collective_rpc ship a function
# (patches.fuzz.worker_stats) to the workers: tests only, never in serving.
TEST_ENGINE_ENV = {**ENGINE_ENV, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
ENGINE_KWARGS = dict(
    dtype="float32", seed=0, max_model_len=1024, max_num_seqs=32, enable_prefix_caching=True, disable_log_stats=False
)


@pytest.fixture(scope="session")
def fixture_model() -> Path:
    from fixture_model.build import ensure_model

    return ensure_model()


def _host(model: Path, env: dict[str, str] | None = None, **kwargs) -> EngineHost:
    return EngineHost(env={**TEST_ENGINE_ENV, **(env or {})}, model=str(model), **{**ENGINE_KWARGS, **kwargs})


# vLLM's one-process engine: EngineCore and the model run inside the host process (vLLM's InprocClient). For
# tests whose subject is what the engine computes (accounting under faults, fuzz outputs), not where it runs: it
# starts in ~13 s instead of ~31 s on 2 cores. The layout users run (EngineCore in a process of its own) stays
# under test wherever it is the subject: the shared engines below (test_fuzz_engine checks the model runs outside
# the frontend), tests/test_plugin.py, and every Serve test (tests/test_serve_app.py, tests/test_load_ab.py).
ONE_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


@pytest.fixture(scope="session")
def start_engine(fixture_model):
    """Factory for engines beyond the shared ones; everything it starts is closed at session end.

    ``one_process=True``: vLLM's one-process engine (:data:`ONE_PROCESS_ENV`)."""
    hosts: list[EngineHost] = []

    def start(env: dict[str, str] | None = None, *, one_process: bool = False, **kwargs) -> EngineHost:
        host = _host(fixture_model, {**(ONE_PROCESS_ENV if one_process else {}), **(env or {})}, **kwargs)
        hosts.append(host)
        return host

    yield start
    for h in hosts:
        h.close()


@pytest.fixture(scope="session")
def patched_engine(start_engine) -> EngineHost:
    """Patches on, eager."""
    return start_engine(enforce_eager=True)


@pytest.fixture(scope="session")
def stock_engine(start_engine) -> EngineHost:
    """Stock vLLM in the same install (FUZZSERVE_PATCHES_OFF=all), eager."""
    return start_engine({OFF_ENV: ALL}, enforce_eager=True)


# --------------------------------------------------------------------------
# Ray Serve: one real local cluster per test session, two nodes, the app
# deployed from serve_config.yaml (HTTP port moved to a free one, API-key auth
# switched on). Shared by the Serve tests and the load-test smoke run.
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def serve_cluster(fixture_model, tmp_path_factory):
    from load_tests.operate.local_cluster import LocalCluster
    from load_tests.operate.ports import free_port

    # head: Serve's controller and proxy, one engine replica;
    # worker: the other replica. An engine replica reserves 2 CPUs (its engine
    # bundle and its frontend; serve_config.yaml), so two CPUs per node place
    # one per node, and the shipped `engine_replicas: fit` counts 2.
    cluster = LocalCluster(
        workers=1,
        num_cpus=2,
        worker_num_cpus=2,
        env={"FUZZSERVE_API_KEYS": SERVE_API_KEY},
        log_dir=tmp_path_factory.mktemp("ray-cluster"),
    )
    try:
        cluster.start()
        cluster.deploy(http_port=free_port())
        yield cluster
    finally:
        cluster.close(graceful=False)  # the last test is done with it: kill by pid, nothing to drain


@pytest.fixture
def handoff_originals(monkeypatch):
    """Every method benchmarks/investigations/handoff_hooks.py wraps comes back after the test (the hooks install
    process-wide; left in place, a later test's install finds them marked and writes to this test's trace). The
    project's patches, which the hooks apply before their marks, are switched off: applied here they would change
    vLLM for every later test of this process."""
    import importlib
    import sys

    from benchmarks.investigations.handoff_hooks import WRAPPED
    from patches.framework.switches import ALL, OFF_ENV

    monkeypatch.setenv(OFF_ENV, ALL)

    for module, cls, attr in WRAPPED:
        if module.startswith("ray.") and module not in sys.modules:
            continue  # the hooks wrap Ray's replica only where it is loaded
        owner = getattr(importlib.import_module(module), cls)
        monkeypatch.setattr(owner, attr, getattr(owner, attr))
