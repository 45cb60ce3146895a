"""The plugin plumbing: entry point, version gate, switches, idempotence."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

from patches.framework import _core as fw
from patches.framework import switches
from patches.shm_wait import NAP_ENV
from serve_app.engine.engine_env import ENGINE_ENV


def test_registered_as_vllm_general_plugin():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert eps.get("fuzzserve_patches") == "patches:register"


def test_version_gate(monkeypatch):
    monkeypatch.delenv(switches.ALLOW_UNVERIFIED_ENV, raising=False)
    fw.check_vllm_version("0.32.0+cpu")
    fw.check_vllm_version("0.32.0")
    with pytest.raises(fw.UnverifiedVllmError) as ei:
        fw.check_vllm_version("0.33.0")
    msg = str(ei.value)
    assert "0.33.0" in msg and "0.32.0" in msg and switches.ALLOW_UNVERIFIED_ENV in msg and switches.OFF_ENV in msg
    monkeypatch.setenv(switches.ALLOW_UNVERIFIED_ENV, "1")
    fw.check_vllm_version("0.33.0")


def test_switches():
    known = ["fuzz", "accounting"]
    assert switches.disabled_patches(known, {}) == set()
    assert switches.disabled_patches(known, {switches.OFF_ENV: "all"}) == set(known)
    assert switches.disabled_patches(known, {switches.OFF_ENV: "ALL"}) == set(known)
    assert switches.disabled_patches(known, {switches.OFF_ENV: " fuzz "}) == {"fuzz"}
    with pytest.raises(ValueError, match="fuzzz"):
        switches.disabled_patches(known, {switches.OFF_ENV: "fuzzz"})


@pytest.mark.parametrize(
    "value, accounting_off",
    [
        (None, False),
        ("", False),
        ("fuzz", False),
        ("fuzz, accounting", True),
        ("all", True),
        ("All", True),
    ],
)
def test_is_off(value, accounting_off):
    assert switches.is_off("accounting", value) is accounting_off


def test_install_is_idempotent():
    class A:
        def f(self):
            return 1

        @staticmethod
        def g():
            return 2

    def twice(orig):
        return lambda *a: orig(*a) * 2

    assert fw.install(A, "f", twice) is True
    assert fw.install(A, "f", twice) is False
    assert A().f() == 2
    assert fw.install(A, "g", twice) is True and fw.install(A, "g", twice) is False
    assert A.g() == 4


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    import os

    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )


PROBE = """
import patches, vllm
from vllm.v1.request import Request
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from patches.framework import _core as fw
from patches.framework.registry import patches as all_patches
patches.register(); patches.register()
w = Request.__init__
print("applied", patches.applied(), getattr(w, "__fuzzserve_patched__", False),
      getattr(getattr(w, "__wrapped_original__", None), "__fuzzserve_patched__", False),
      getattr(GPUModelRunner._prepare_inputs, "__fuzzserve_patched__", False))
for name, patch in all_patches().items():  # every wrap of the registry (docs/patches.md): how often it is in place
    for t in patch.targets:
        if t.kind != "wrap":
            continue
        if t.when is not None and not t.when():
            print("WRAP", f"{name}:{t.symbol}", "not-here")
            continue
        obj, times = getattr(t.owner(), t.attr), 0
        while obj is not None:  # every change stacked on the symbol, down to upstream's function
            obj = getattr(obj, "__func__", obj)
            times += getattr(obj, "__fuzzserve_key__", None) == fw.change_key(t.make)
            obj = getattr(obj, "__wrapped_original__", None)
        print("WRAP", f"{name}:{t.symbol}", times)
"""


def _wraps(out: str) -> dict[str, str]:
    """``patch:symbol`` -> how often that patch's wrap is in place (two patches may wrap one symbol)."""
    return {line.split()[1]: line.split()[2] for line in out.splitlines() if line.startswith("WRAP")}


def test_register_applies_once_and_switches_off():
    """register() twice applies every wrap of the registry exactly once; with every patch off, none."""
    from patches.framework.registry import patches as all_patches

    n_wraps = sum(t.kind == "wrap" for p in all_patches().values() for t in p.targets)
    on = _run(PROBE, {switches.OFF_ENV: ""})
    assert on.returncode == 0, on.stderr
    applied = (
        "['accounting', 'cpu_inproc', 'cpu_offload', 'early_submit', 'fuzz', 'fuzz_layer', 'inline_render', "
        "'kv_faults', 'shm_wait', 'stats_thread']"
    )
    assert f"applied {applied} True False True" in on.stdout
    assert len(_wraps(on.stdout)) == n_wraps and set(_wraps(on.stdout).values()) <= {"1", "not-here"}
    off = _run(PROBE, {switches.OFF_ENV: "all"})
    assert off.returncode == 0, off.stderr
    assert "applied [] False False False" in off.stdout
    assert len(_wraps(off.stdout)) == n_wraps and set(_wraps(off.stdout).values()) <= {"0", "not-here"}


def test_register_refuses_an_unverified_vllm():
    code = "import vllm; vllm.__version__ = '0.31.0'; import patches; patches.register()"
    r = _run(code, {switches.OFF_ENV: "", switches.ALLOW_UNVERIFIED_ENV: ""})
    assert r.returncode != 0 and "0.31.0" in r.stderr and "UnverifiedVllmError" in r.stderr


AOT_KEY = """
import sys, patches
patches.register()
from vllm.engine.arg_utils import EngineArgs
import vllm.compilation.caching as c
cfg = EngineArgs(model=sys.argv[1], dtype="float32", max_model_len=256).create_engine_config()
print("FACTORS", c.aot_compile_hash_factors(cfg))
"""


@pytest.mark.engine  # builds the fixture model on a fresh clone (it trains it)
def test_patch_is_part_of_the_compile_cache_key(fixture_model):
    """A graph compiled by stock vLLM must never be loaded by a patched engine.

    (On this CPU build vLLM 0.32 fails to load any AOT artifact and recompiles,
    so tests/test_fuzz_compiled.py cannot show the reuse; this checks the key.)
    """

    def factors(off: str) -> list[str]:
        r = subprocess.run(
            [sys.executable, "-c", AOT_KEY, str(fixture_model)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**__import__("os").environ, switches.OFF_ENV: off, "VLLM_USE_V2_MODEL_RUNNER": "0", **ENGINE_ENV},
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return eval(r.stdout.split("FACTORS", 1)[1].strip())

    patched, stock = factors(""), factors("all")
    assert patched[:-2] == stock and patched[-2].startswith("fuzzserve-fuzz:")
    assert patched[-1].startswith("fuzzserve-fuzz_layer:")


NAP_PROBE = """
import json, time, zmq, patches
slept, yielded = [], []
real_sleep, time.sleep = time.sleep, slept.append  # the wrap binds time.sleep as it is applied: record its naps
patches.register()
time.sleep = real_sleep
from vllm.distributed.device_communicators import shm_broadcast
shm_broadcast.sched_yield = lambda: yielded.append(1)  # what upstream's busy reader calls instead
reader = shm_broadcast.SpinCondition(True, zmq.Context(), "ipc:///tmp/fuzzserve-nap-probe")
reader.busy_loop_s = 3600.0  # the busy window, however slow this host is
reader.record_read()
for _ in range(50):
    reader.wait()
print("WAITS", json.dumps({"naps": slept, "yields": len(yielded)}))
"""


def _waits(env: dict[str, str]) -> dict:
    """What 50 waits of a busy ring-buffer reader did: the naps they took (seconds) and the sched_yields."""
    r = _run(NAP_PROBE, {switches.OFF_ENV: "", NAP_ENV: "", **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.split("WAITS", 1)[1])


def test_shm_wait_naps_instead_of_spinning():
    """A busy reader's wait: a nap of FUZZSERVE_SHM_NAP_S when patched, upstream's sched_yield when not (what each
    turn calls, not how long it took: no clock in the verdict)."""
    from patches.shm_wait import DEFAULT_NAP_S

    assert _waits({NAP_ENV: "0.004"}) == {"naps": [0.004] * 50, "yields": 0}
    assert _waits({}) == {"naps": [DEFAULT_NAP_S] * 50, "yields": 0}
    assert _waits({switches.OFF_ENV: "shm_wait", NAP_ENV: "0.004"}) == {"naps": [], "yields": 50}


def test_shm_wait_refuses_a_bad_nap():
    from patches.shm_wait import DEFAULT_NAP_S, nap_seconds

    assert nap_seconds({}) == DEFAULT_NAP_S and nap_seconds({NAP_ENV: "0.001"}) == 0.001
    for bad in ("-1", "soon", "nan", "1"):
        with pytest.raises(ValueError, match=NAP_ENV):
            nap_seconds({NAP_ENV: bad})


@pytest.fixture(scope="session")
def worker_process_engine(start_engine):
    """Patches on but ``cpu_inproc``: the model in a worker process behind the shared-memory ring, as upstream."""
    return start_engine({switches.OFF_ENV: "cpu_inproc"}, enforce_eager=True)


@pytest.mark.engine
def test_shm_wait_is_applied_in_the_worker(worker_process_engine, stock_engine):
    """With a worker process (cpu_inproc off), the plugin reaches it and its ring waits nap; stock vLLM spins."""
    from patches.shm_wait import DEFAULT_NAP_S, patch_state
    from testkit.engine_host import engine_processes

    [worker] = worker_process_engine.rpc(patch_state)
    assert worker_process_engine.eval(engine_processes)[worker["pid"]].startswith("VLLM::Worker")
    assert worker["patched"] and worker["nap_s"] == DEFAULT_NAP_S
    [stock] = stock_engine.rpc(patch_state)
    assert not stock["patched"]


@pytest.mark.engine
def test_cpu_inproc_runs_the_model_in_engine_core(patched_engine, worker_process_engine, stock_engine):
    """cpu_inproc: the model runs in EngineCore, no worker process, with the OpenMP environment upstream gives its
    worker; switched off (alone, or with every patch) upstream's worker process is back."""
    from patches.cpu_inproc import executor_state
    from testkit.engine_host import engine_processes

    [inproc] = patched_engine.rpc(executor_state)
    titles = patched_engine.eval(engine_processes)
    assert titles[inproc["pid"]].startswith("VLLM::EngineCore"), titles
    assert not any(t.startswith("VLLM::Worker") for t in titles.values()), titles
    for engine in (worker_process_engine, stock_engine):
        [worker] = engine.rpc(executor_state)
        assert engine.eval(engine_processes)[worker["pid"]].startswith("VLLM::Worker")
        assert worker["OMP_NUM_THREADS"] is not None, worker  # upstream set the worker's environment
        # and EngineCore got the same (same cores: every engine here starts with vLLM's `auto` binding)
        assert {k: v for k, v in inproc.items() if k != "pid"} == {k: v for k, v in worker.items() if k != "pid"}
