"""Per-role CPU accounting of the benchmarks (pure logic plus a real measurement of this process)."""

import os
import signal
import subprocess
import time

import pytest

from benchmarks.harness import cpu_accounting
from benchmarks.serve_stack import cpu_columns


def test_own_cpu_is_measured_as_the_load_generator():
    before = cpu_accounting.snapshot()
    t = time.process_time()
    while time.process_time() - t < 0.3:  # burn 0.3 s of CPU in this process
        pass
    cpu = cpu_accounting.delta(before, cpu_accounting.snapshot())
    assert cpu["load generator"] == pytest.approx(0.3, abs=0.1)


def test_delta_counts_new_processes_from_zero_and_drops_the_dead():
    before = {1: ("Ray system", 5.0), 2: ("EngineCore", 1.0)}
    after = {1: ("Ray system", 5.5), 3: ("EngineCore", 0.25)}
    assert cpu_accounting.delta(before, after) == {"Ray system": 0.5, "EngineCore": 0.25}


def test_columns_attribute_roles_to_the_driven_target():
    cpu = {
        "load generator": 1.0,
        "Serve proxy": 2.0,
        "replica c:FuzzIngress": 3.0,
        "replica c:LLMServer:fixture": 4.0,
        "EngineCore of replica c:LLMServer:fixture": 5.0,
        "replica e:LLMServer:fixture": 0.5,
        "vLLM API server": 0.25,
        "Ray system": 0.125,
    }
    cols = cpu_columns(cpu, "c")
    assert cols == {
        "client": 1.0,
        "proxy": 2.0,
        "ingress": 3.0,
        "frontend": 4.0,
        "engine": 5.0,
        "Ray": 0.125,
        "idle targets": 0.75,
    }
    assert cpu_columns({"vLLM API server": 1.0, "EngineCore of vLLM API server": 2.0}, "a")["frontend"] == 1.0


def test_engine_processes_count_as_their_replicas_engine():
    own = {
        10: "replica c:LLMServer:fixture.handle_request",
        11: "EngineCore",
        12: None,
        20: "vLLM API server",
        21: "EngineCore",
        22: None,
        30: None,
    }
    parent = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20, 22: 21, 30: 1}
    roles = cpu_accounting.resolve_roles(own, parent)
    assert roles[12] == roles[11] == "EngineCore of replica c:LLMServer:fixture.handle_request"  # the worker
    assert roles[22] == "EngineCore of vLLM API server" and roles[30] is None
    assert cpu_columns({roles[12]: 2.0}, "c")["engine"] == 2.0


def _loadgen(body: str) -> subprocess.Popen:
    """A stand-in load generator: a shell whose two children run ``body`` on core 0 alone (they inherit its role)."""
    core = min(os.sched_getaffinity(0))
    script = f"taskset -c {core} sh -c '{body}' & taskset -c {core} sh -c '{body}' & wait"
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def _waited(body: str, seconds: float = 0.6) -> float:
    proc = _loadgen(body)
    try:
        time.sleep(0.2)  # both children started
        before = cpu_accounting.wait_snapshot(proc.pid)
        time.sleep(seconds)
        after = cpu_accounting.wait_snapshot(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return cpu_accounting.delta(before, after).get(cpu_accounting.CLIENT_ROLE, 0.0)


def test_threads_that_share_one_core_are_seen_waiting_for_it():
    """Two busy processes on one core: each waits about half the time, read from the kernel's schedstat."""
    assert _waited("while :; do :; done") > 0.25


def test_sleeping_threads_do_not_wait_for_a_core():
    """The negative control: the same two processes asleep wait for nothing."""
    assert _waited("sleep 5") < 0.05


def test_waits_sum_every_thread_of_a_process(tmp_path, monkeypatch):
    """Each thread's second schedstat field (ns runnable, not running), summed per process; a thread whose file
    is gone or unreadable is skipped."""
    for tid, line in ((10, "5 2000000000 3"), (11, "1 500000000 1"), (12, "garbage")):
        d = tmp_path / "10" / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "schedstat").write_text(line + "\n")
    monkeypatch.setattr(cpu_accounting, "_roles", lambda pid: ({10: None}, {10: "x"}, {10: "x", 99: None}))
    assert cpu_accounting.wait_snapshot(None, proc=str(tmp_path)) == {10: ("x", 2.5)}


def test_one_scan_reads_both_the_cpu_and_the_waits(tmp_path, monkeypatch):
    """snapshots() gives what snapshot() and wait_snapshot() give, scanning the processes once."""
    (tmp_path / "10" / "task" / "10").mkdir(parents=True)
    (tmp_path / "10" / "task" / "10" / "schedstat").write_text("5 2000000000 3\n")
    scans = []

    def roles(pid):
        scans.append(pid)
        return {10: _FakeProc()}, {10: "x"}, {10: "x"}

    monkeypatch.setattr(cpu_accounting, "_roles", roles)
    assert cpu_accounting.snapshots(None, proc=str(tmp_path)) == ({10: ("x", 1.5)}, {10: ("x", 2.0)})
    assert len(scans) == 1


class _FakeProc:
    def cpu_times(self):
        class T:
            user, system = 1.0, 0.5

        return T()
