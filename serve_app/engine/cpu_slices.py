"""A short CPU scheduler slice for the engine replica's own threads, so that they get a core soon after they wake.

Why: on a CPU host the replica's process (Serve's HTTP loop, the loop vLLM's
OpenAI app and ``AsyncLLM`` run on, the tokenizer's threads) shares the
cores with EngineCore, whose steps run for milliseconds at a time, and with
the client and HAProxy. Each request crosses the replica's threads several
times (the request in, the hand-off to EngineCore, every streamed chunk
out), and each crossing is a thread waking up. Measured on the 2-core host
at 8 in flight (per-thread ``/proc/<pid>/task/<tid>/schedstat``; results log
2026-11-29 17:34), the replica's two event-loop threads ran 0.30 and 0.12 s
per second and **waited for a core 0.25 and 0.24 s per second**: about
16 ms of waiting per request, the first token's included, while EngineCore
(pinned, 0.78 s/s) held the core they woke on.

What: Linux's EEVDF scheduler (6.6+; per-task slices since 6.12) lets a task
ask for a shorter time slice (``sched_attr.sched_runtime`` of a
``SCHED_OTHER`` task, 0.1-100 ms; the default here is 0.7 ms x (1 + log2
cores)). A task with a shorter slice gets an earlier virtual deadline, so
when it wakes it preempts a task with a longer one (the kernel's
``PREEMPT_SHORT``). It does not get more CPU: its share is its weight's (its
nice value), unchanged. :func:`shorten_process` gives every thread of this
process that slice; threads and processes started later inherit it from the
thread that starts them. The replica calls it after its engine has started,
so EngineCore (a child started before) keeps the kernel's default and the
engine's steps are the ones preempted. No privilege is needed: a task may
set its own slice (checked as an unprivileged user on the kernel here).

Where the kernel has no per-task slices (before 6.12) the call succeeds
and changes nothing; :func:`shorten_process` reads the slice back and says
so in the log. Any other failure (another OS, a thread that ended meanwhile)
is logged and skipped: a replica never fails to start over a scheduling hint.
The builder argument ``frontend_slice_us`` (``serve_app.config.deploy_config``)
sets it; ``null`` leaves every thread at the kernel's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger("ray.serve")

# sched_setattr(2) / sched_getattr(2) numbers; glibc has no wrapper for either
SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
SCHED_OTHER, SCHED_BATCH = 0, 3  # the fair policies, the only ones a slice applies to
MIN_SLICE_US, MAX_SLICE_US = 100, 100_000  # the kernel clamps a requested slice to this range


class SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (include/uapi/linux/sched/types.h), up to the utilization clamps (size 56)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("sched_policy", ctypes.c_uint32),
        ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32),
        ("sched_priority", ctypes.c_uint32),
        ("sched_runtime", ctypes.c_uint64),  # a fair task's slice, ns (0: the kernel's default)
        ("sched_deadline", ctypes.c_uint64),
        ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32),
        ("sched_util_max", ctypes.c_uint32),
    ]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def _numbers() -> tuple[int, int]:
    machine = platform.machine()
    if machine not in SYSCALLS or platform.system() != "Linux":
        raise OSError(f"no sched_setattr number known for {platform.system()} {machine}")
    return SYSCALLS[machine]


def get_attr(tid: int) -> SchedAttr:
    """The scheduling attributes of thread ``tid`` (0: the calling thread)."""
    _, getattr_nr = _numbers()
    attr = SchedAttr()
    attr.size = ctypes.sizeof(attr)
    if _libc().syscall(getattr_nr, tid, ctypes.byref(attr), ctypes.sizeof(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_getattr({tid}): {os.strerror(err)}")
    return attr


def set_slice(tid: int, slice_ns: int) -> bool:
    """Give thread ``tid`` a slice of ``slice_ns`` (0: the kernel's default), keeping its policy and nice value.
    False, and nothing changed, for a thread not on a fair policy (real-time or idle threads keep theirs)."""
    setattr_nr, _ = _numbers()
    attr = get_attr(tid)
    if attr.sched_policy not in (SCHED_OTHER, SCHED_BATCH):
        return False
    attr.sched_flags = 0
    attr.sched_runtime = slice_ns
    if _libc().syscall(setattr_nr, tid, ctypes.byref(attr), 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sched_setattr({tid}): {os.strerror(err)}")
    return True


def thread_slice_ns(tid: int) -> int:
    """The slice the kernel holds for thread ``tid`` (its default where none was asked for, 0 before 6.12)."""
    return int(get_attr(tid).sched_runtime)


def shorten_process(slice_us: int, pid: int | None = None) -> int:
    """Give every thread of process ``pid`` (default: this one) a slice of ``slice_us``; the number of threads
    changed. Threads started meanwhile by a thread already changed inherit the slice; a second pass catches the
    others. Logs and returns 0 where the kernel cannot (another OS, no per-task slices)."""
    if not MIN_SLICE_US <= slice_us <= MAX_SLICE_US:
        raise ValueError(f"a slice must be {MIN_SLICE_US}-{MAX_SLICE_US} us, got {slice_us}")
    pid = os.getpid() if pid is None else pid
    slice_ns = slice_us * 1000
    done: set[int] = set()
    try:
        for _ in range(2):
            for name in os.listdir(f"/proc/{pid}/task"):
                tid = int(name)
                if tid in done:
                    continue
                try:
                    if set_slice(tid, slice_ns):
                        done.add(tid)
                except ProcessLookupError:  # the thread ended meanwhile
                    continue
        held = thread_slice_ns(pid)
    except OSError as e:
        log.warning("frontend_slice_us=%d not applied: %s", slice_us, e)
        return 0
    if held != slice_ns:
        log.warning(
            "frontend_slice_us=%d: the kernel holds a slice of %d ns (per-task slices need Linux 6.12+); "
            "the replica's threads keep the kernel's default",
            slice_us,
            held,
        )
        return 0
    log.info("replica process %d: %d threads on a %d us scheduler slice", pid, len(done), slice_us)
    return len(done)
