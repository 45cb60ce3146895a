"""Which cores each engine replica gets (serve_app.engine.core_binding): pure logic.

That a deployed replica's engine really runs on those cores is checked on a
real cluster in tests/test_serve_app.py.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.engine.core_binding import BIND_ENV, bind_engine_threads, replica_cores


def test_two_cores_one_per_replica_and_a_third_replica_shares():
    assert replica_cores(0, 1, [0, 1]) == ([0], False)
    assert replica_cores(1, 1, [1, 0]) == ([1], False)
    assert replica_cores(2, 1, [0, 1]) == ([0], True)


def test_slots_follow_the_allowed_cores_not_their_numbers():
    allowed = [9, 2, 7, 5]
    assert replica_cores(0, 2, allowed) == ([2, 5], False)
    assert replica_cores(1, 2, allowed) == ([7, 9], False)
    assert replica_cores(0, 3, allowed) == ([2, 5, 7], False)  # one slot; the fourth core is left over
    assert replica_cores(1, 3, allowed) == ([2, 5, 7], True)


@pytest.mark.parametrize("k,rank,msg", [(0, 0, "must be >= 1"), (3, 0, "only 2 cores"), (1, -1, "local rank")])
def test_impossible_requests_are_refused(k, rank, msg):
    with pytest.raises(ValueError, match=msg):
        replica_cores(rank, k, [0, 1])


@settings(max_examples=200, deadline=None)
@given(allowed=st.sets(st.integers(0, 255), min_size=1, max_size=64), data=st.data())
def test_replicas_within_the_slots_get_disjoint_cores_of_their_own(allowed, data):
    k = data.draw(st.integers(1, len(allowed)))
    slots = len(allowed) // k
    got = [replica_cores(r, k, sorted(allowed)) for r in range(slots)]
    assert not any(shared for _, shared in got)
    cores = [c for cs, _ in got for c in cs]
    assert all(len(cs) == k for cs, _ in got)
    assert len(set(cores)) == len(cores) and set(cores) <= allowed
    beyond = replica_cores(slots, k, sorted(allowed))  # the first rank past the slots wraps to slot 0
    assert beyond == (got[0][0], True)


def test_binding_sets_vllms_variable_and_says_so(caplog, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    env = {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        assert bind_engine_threads(1, 1, env) == "1"
    assert env[BIND_ENV] == "1"
    assert "overrides VLLM_CPU_OMP_THREADS_BIND=auto" in caplog.text and "bound to cores 1" in caplog.text


def test_a_replica_without_a_rank_keeps_vllms_binding(caplog):
    env: dict[str, str] = {}
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        assert bind_engine_threads(1, None, env) is None
    assert env == {} and "has no rank" in caplog.text


_CHILD = """
import sys, threading, time
import setproctitle
setproctitle.setproctitle(sys.argv[1])
for _ in range(3):
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", flush=True)
time.sleep(60)
"""


def test_engine_core_children_are_pinned_thread_by_thread_and_nothing_else(request):
    """Real child processes: an "EngineCore" with four threads, and a sibling with another title.

    Every thread of the EngineCore child ends up on the given core (pinning
    only the process's main thread would leave its other threads floating);
    the sibling and this process keep every core.
    """
    import os
    import subprocess
    import sys

    import psutil

    from serve_app.engine.core_binding import pin_engine_cores

    allowed = sorted(os.sched_getaffinity(0))
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, title], stdout=subprocess.PIPE, text=True)
        for title in ("VLLM::EngineCore", "VLLM::Worker")
    ]
    for c in children:
        request.addfinalizer(c.wait)
        request.addfinalizer(c.kill)
    for c in children:
        assert c.stdout is not None
        assert c.stdout.readline().strip() == "ready"
    engine, sibling = (psutil.Process(c.pid) for c in children)
    assert len(engine.threads()) == 4

    assert pin_engine_cores({allowed[0]}) == [engine.pid]
    assert {t.id: os.sched_getaffinity(t.id) for t in engine.threads()} == {
        t.id: {allowed[0]} for t in engine.threads()
    }
    assert all(os.sched_getaffinity(t.id) == set(allowed) for t in sibling.threads())
    assert os.sched_getaffinity(0) == set(allowed)
    assert pin_engine_cores({allowed[0]}, parent_pid=sibling.pid) == []  # no EngineCore below it


@pytest.mark.parametrize(
    "before, after",
    [
        (None, "shm_wait"),
        ("", "shm_wait"),
        ("accounting", "accounting,shm_wait"),
        ("accounting, shm_wait", "accounting,shm_wait"),
        ("all", "all"),
        ("ALL", "ALL"),
    ],
)
def test_shm_wait_false_switches_only_that_patch_off_in_the_replicas_environment(before, after):
    """``shm_wait: false`` adds the patch to FUZZSERVE_PATCHES_OFF (what the engine's processes inherit),
    keeping what the cluster already switched off; the patches' own parser reads the result."""
    from patches import PATCH_MODULES
    from patches.framework.switches import OFF_ENV, disabled_patches
    from serve_app.engine.core_binding import switch_patch_off

    env = {} if before is None else {OFF_ENV: before}
    assert switch_patch_off("shm_wait", env) == after == env[OFF_ENV]
    off = disabled_patches(list(PATCH_MODULES), env)
    assert "shm_wait" in off and off >= disabled_patches(
        list(PATCH_MODULES), {} if before is None else {OFF_ENV: before}
    )


_ENGINE_WITH_WORKER = """
import subprocess, sys, threading, time
import setproctitle
setproctitle.setproctitle("VLLM::EngineCore")
worker = subprocess.Popen([sys.executable, "-c", sys.argv[1], "VLLM::Worker"], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == "ready"
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("ready", worker.pid, flush=True)
time.sleep(60)
"""


def test_a_replica_that_serve_renumbers_repins_its_running_engine_and_workers(request, caplog):
    """Serve reassigns local ranks after a scale-down and calls ``reconfigure(user_config, rank=...)`` on a replica
    whose ``reconfigure`` takes a rank (Ray's replica.py, call_reconfigure): the engine (a real EngineCore-titled
    child with a worker below it) moves to the new rank's cores; the same rank, or no binding, changes nothing."""
    import inspect
    import os
    import subprocess
    import sys
    import types

    import psutil

    from serve_app.engine.core_binding import EngineServer, replica_cores

    assert "rank" in inspect.signature(EngineServer.reconfigure).parameters, "Serve passes rank only to such a method"
    allowed = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", _ENGINE_WITH_WORKER, _CHILD], stdout=subprocess.PIPE, text=True)
    request.addfinalizer(child.wait)
    request.addfinalizer(child.kill)
    assert child.stdout is not None
    _ready, worker_pid = child.stdout.readline().split()
    request.addfinalizer(lambda: psutil.Process(int(worker_pid)).kill() if psutil.pid_exists(int(worker_pid)) else None)
    engine, worker = psutil.Process(child.pid), psutil.Process(int(worker_pid))

    def masks() -> set[frozenset[int]]:
        return {frozenset(os.sched_getaffinity(t.id)) for p in (engine, worker) for t in p.threads()}

    server = EngineServer.__new__(EngineServer)
    server._engine_cores_per_replica, server._local_rank = None, None
    server.reconfigure(None, rank=types.SimpleNamespace(local_rank=1))
    assert masks() == {frozenset(allowed)}, "no engine_cores_per_replica: nothing is pinned"

    server._engine_cores_per_replica, server._local_rank = 1, 0
    server.reconfigure(None, rank=types.SimpleNamespace(local_rank=0))
    assert masks() == {frozenset(allowed)}, "the rank it is bound for: nothing to do"
    with caplog.at_level("INFO", logger="ray.serve"):
        server.reconfigure(None, rank=types.SimpleNamespace(local_rank=1))
    want = frozenset(replica_cores(1, 1, allowed)[0])
    assert masks() == {want} and server._local_rank == 1
    assert "local rank 0 -> 1" in caplog.text
