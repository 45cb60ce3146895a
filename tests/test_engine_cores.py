"""load_tests/observe/engine_cores.py: each EngineCore's cores read from /proc, and the overlap an operations run
records after each step (issue 34: the re-pin after Serve renumbers replicas)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from load_tests.observe.engine_cores import engine_cores, overlapping, parse_cpu_list, thread_cores


def test_cpu_lists_parse_as_the_kernel_writes_them():
    assert parse_cpu_list("0-2,5\n") == {0, 1, 2, 5}
    assert parse_cpu_list("1") == {1} and parse_cpu_list("") == set()


def test_a_processes_threads_are_read_from_proc(tmp_path):
    for tid, cores in (("100", "0"), ("101", "1-2")):
        (tmp_path / "100" / "task" / tid).mkdir(parents=True)
        (tmp_path / "100" / "task" / tid / "status").write_text(f"Name:\tx\nCpus_allowed_list:\t{cores}\nFoo:\t1\n")
    assert thread_cores(100, tmp_path) == {0, 1, 2}
    assert thread_cores(999, tmp_path) is None, "a process that is gone has no cores"
    # this very process, from the real /proc: what the kernel says it may use
    assert thread_cores(os.getpid()) == set(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning a child to one of two cores needs two")
def test_an_engine_core_child_is_found_by_name_and_its_pinning_read():
    """A child named as vLLM names its EngineCore, pinned to one core, under a parent: found, with that core; a
    child of another name is not an engine."""
    core = min(os.sched_getaffinity(0))
    kid = (
        "import os, sys, time, ctypes; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0); "
        "os.sched_setaffinity(0, {int(sys.argv[2])}); print('ready', flush=True); time.sleep(60)"
    )
    # a parent of its own (as a replica is): the pytest process may have other engines under it (a session
    # engine fixture's EngineCore), which are not this test's
    code = (
        "import subprocess, sys; kids = [subprocess.Popen([sys.executable, '-c', sys.argv[1], n, sys.argv[2]], "
        "stdout=subprocess.PIPE, text=True) for n in ('VLLM::EngineCore', 'not-an-engine')]; "
        "[k.stdout.readline() for k in kids]; print(*[k.pid for k in kids], flush=True); "
        "[k.wait() for k in kids]"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, kid, str(core)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    try:
        engine, other = map(int, parent.stdout.readline().split())
        found = engine_cores(parent.pid)
        assert found == {engine: [core]}, found
        assert other in {c.pid for c in psutil.Process(parent.pid).children()}, "the other child runs, unnamed"
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_overlap_is_named_only_where_the_node_has_a_core_for_each():
    assert overlapping({"a": [0], "b": [1]}, node_cores=2) == []
    assert overlapping({"a": [0], "b": [0]}, node_cores=2) == [("a", "b")]  # the bug the re-pin fixed: both on 0
    assert overlapping({"a": [0], "b": [1], "c": [0]}, node_cores=2) == [], "3 replicas on 2 cores must share"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two replicas on disjoint cores need two")
def test_the_view_a_run_records_names_replicas_whose_engines_share_a_core():
    """Two 'replicas' (parent processes), each with a child named as vLLM's EngineCore: on disjoint cores no
    overlap is recorded; both pinned to one core, the pair is named for their node."""
    from load_tests.observe.engine_cores import engine_cores_view

    code = (
        "import os, sys, time, ctypes, subprocess; "
        "kid = subprocess.Popen([sys.executable, '-c', 'import os, sys, time, ctypes; "
        'ctypes.CDLL(None).prctl(15, b"VLLM::EngineCore", 0, 0, 0); '
        'os.sched_setaffinity(0, {int(sys.argv[1])}); print("ready", flush=True); time.sleep(60)\', sys.argv[1]]); '
        "time.sleep(60)"
    )
    a, b = sorted(os.sched_getaffinity(0))[:2]

    def replicas(cores):
        procs = [
            subprocess.Popen([sys.executable, "-c", code, str(c)], stdout=subprocess.PIPE, text=True) for c in cores
        ]
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        records = [
            {"name": f"SERVE_REPLICA::app#LLMServer:fixture#r{i}", "pid": p.pid, "node_id": "n" * 10}
            for i, p in enumerate(procs)
        ]
        return procs, records

    for cores, want in (((a, b), {}), ((a, a), {"nnnnnnnn": [("r0", "r1")]})):
        procs, records = replicas(cores)
        try:
            view = engine_cores_view(records)
            assert sorted(
                v["engines"] and next(iter(v["engines"].values())) for v in view["replicas"].values()
            ) == sorted([[c] for c in cores])
            assert {n: [tuple(p) for p in pairs] for n, pairs in view["overlapping"].items()} == want, view
        finally:
            for p in procs:
                for child in psutil.Process(p.pid).children(recursive=True):
                    child.kill()
                p.kill()
                p.wait()
