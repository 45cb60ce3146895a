"""The replica's scheduler slice (serve_app.engine.cpu_slices) on this host's real kernel: set, read back,
inherited, and never applied to a thread it must not touch. The machine kind this project runs on has Linux
6.18; a kernel without per-task slices fails the first two tests here (the replica itself only logs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from serve_app.engine import cpu_slices

CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from serve_app.engine import cpu_slices
    before = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    before.start()                                  # a thread that exists when the process is shortened
    n = cpu_slices.shorten_process(int(sys.argv[1]))
    after = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    after.start()                                   # one started afterwards: inherits the slice
    child = __import__("subprocess").Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    print(n, before.native_id, after.native_id, child.pid, flush=True)
    time.sleep(30)
    """
)


def proc_slice(pid: int, tid: int | None = None) -> int:
    """The slice as /proc shows it (se.slice), independent of the module's own read-back."""
    path = f"/proc/{pid}/task/{tid}/sched" if tid else f"/proc/{pid}/sched"
    with open(path) as f:
        return next(int(line.split()[-1]) for line in f if line.startswith("se.slice"))


def test_a_process_and_what_it_starts_afterwards_get_the_slice():
    default = proc_slice(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", CHILD, "100"], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        assert proc.stdout is not None
        n, before, after, grandchild = map(int, proc.stdout.readline().split())
        assert n >= 2  # the main thread and the one started before
        for tid in (proc.pid, before, after):
            assert proc_slice(proc.pid, tid) == 100_000
        assert proc_slice(grandchild) == 100_000  # a process it starts inherits it too
        assert proc_slice(os.getpid()) == default  # the caller's own process is untouched
    finally:
        proc.kill()
        proc.wait()


def test_a_slice_resets_to_the_kernels_default():
    """The negative control of the read-back: 0 gives a thread the kernel's default again."""
    default = cpu_slices.thread_slice_ns(0)
    import threading

    result = {}

    def body():
        tid = threading.get_native_id()
        cpu_slices.set_slice(tid, 250_000)
        result["set"] = proc_slice(os.getpid(), tid)
        cpu_slices.set_slice(tid, 0)
        result["reset"] = proc_slice(os.getpid(), tid)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert result == {"set": 250_000, "reset": default}


def test_a_real_time_thread_is_left_alone(monkeypatch):
    """Only fair-policy threads get a slice: a SCHED_FIFO thread is reported as skipped, never changed."""
    attr = cpu_slices.SchedAttr()
    attr.sched_policy = 1  # SCHED_FIFO
    monkeypatch.setattr(cpu_slices, "get_attr", lambda tid: attr)
    calls = []
    monkeypatch.setattr(cpu_slices, "_libc", lambda: calls.append(1))
    assert cpu_slices.set_slice(123, 100_000) is False and not calls


@pytest.mark.parametrize("slice_us", [0, 99, 100_001])
def test_a_slice_out_of_the_kernels_range_is_refused(slice_us):
    with pytest.raises(ValueError, match="100-100000 us"):
        cpu_slices.shorten_process(slice_us)


def test_a_kernel_that_ignores_the_slice_is_logged_not_fatal(monkeypatch, caplog):
    """Before Linux 6.12 sched_setattr succeeds and the slice reads back 0: the replica starts, and says so."""
    monkeypatch.setattr(cpu_slices, "set_slice", lambda tid, ns: True)
    monkeypatch.setattr(cpu_slices, "thread_slice_ns", lambda tid: 0)
    with caplog.at_level("WARNING", logger="ray.serve"):
        assert cpu_slices.shorten_process(100) == 0
    assert "Linux 6.12+" in caplog.text


def test_the_config_bounds_match_the_kernels():
    from serve_app.config.deploy_config import FuzzServeArgs

    field = FuzzServeArgs.model_fields["frontend_slice_us"]
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Ge"].ge == cpu_slices.MIN_SLICE_US and bounds["Le"].le == cpu_slices.MAX_SLICE_US
