"""Where the CPU goes during a benchmark run: CPU seconds per process role, from the OS.

On a 2-core host every serving process competes for the same two cores, so
the question "why is the Serve stack slower than a plain vLLM server" is
mostly "which processes burn CPU per request". This samples every process's
user+system CPU time (psutil) before and after a run and attributes the
difference to a role read from the process title: Ray Serve names its actor
processes (``ray::ServeReplica:<app>:<deployment>``, ``ray::ProxyActor``,
...), vLLM names its engine processes (``VLLM::EngineCore``), and a process
without a telling title inherits its nearest named ancestor's role.

Cheaper than a sampling profiler and attributes everything, including
processes a profiler would have to be attached to one by one (an
engine's EngineCore and its worker processes count as that engine's); py-spy remains
the tool for *which function* inside a role (docs/results_log.md, the profile_stack entries).
"""

from __future__ import annotations

import os

import psutil

from serve_app.config.names import PROCESS_TITLE_PREFIX

Snapshot = dict[int, tuple[str, float]]

# The benchmark client's role. Its CPU per request is fixed work (the same prompts, read the same way, from any arm
# that streams every token), so across the arms of a pair it marks the host's speed (vs_vllm's report).
CLIENT_ROLE = "load generator"


def _own_role(p: psutil.Process, loadgen_pid: int) -> str | None:
    """The role a process's own title or command line names, or None."""
    if p.pid == loadgen_pid:
        return CLIENT_ROLE
    try:
        name = p.name()
        args = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    title = args[0] if args else name
    if title.startswith("VLLM::EngineCore") or name.startswith("VLLM::EngineCor"):
        return "EngineCore"
    if title.startswith(PROCESS_TITLE_PREFIX):  # ray::ServeReplica:<app>:<deployment>
        return "replica " + title.split()[0].removeprefix(PROCESS_TITLE_PREFIX)
    if title.startswith("ray::ProxyActor") or "haproxy" in name:
        return "Serve proxy"
    if title.startswith("ray::ServeController"):
        return "Serve controller"
    if "vllm.entrypoints.openai.api_server" in " ".join(args):
        return "vLLM API server"
    for key, role in (
        ("raylet", "Ray system"),
        ("gcs_server", "Ray system"),
        ("dashboard", "Ray system"),
        ("ray/_private", "Ray system"),
        ("log_monitor", "Ray system"),
        ("monitor.py", "Ray system"),
    ):
        if key in " ".join(args[:3]):
            return role
    if title.startswith("ray::"):
        return "Ray worker (other)"
    return None


def _roles(loadgen_pid: int | None) -> tuple[dict[int, psutil.Process], dict[int, str | None], dict[int, str | None]]:
    """(pid -> process, pid -> role its own title names, pid -> resolved role) for every process."""
    loadgen_pid = os.getpid() if loadgen_pid is None else loadgen_pid
    procs = {p.pid: p for p in psutil.process_iter()}
    own = {pid: _own_role(p, loadgen_pid) for pid, p in procs.items()}
    parent: dict[int, int] = {}
    for pid, p in procs.items():
        try:
            parent[pid] = p.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            parent[pid] = 0
    return procs, own, resolve_roles(own, parent)


def titled_processes(loadgen_pid: int | None = None) -> dict[int, str]:
    """pid -> resolved role, only for processes whose own title names a role (the ones worth profiling)."""
    _procs, own, roles = _roles(loadgen_pid)
    return {pid: role for pid, r in own.items() if r is not None and (role := roles.get(pid))}


def _benchmark_processes(loadgen_pid: int | None) -> list[tuple[int, psutil.Process, str]]:
    """(pid, process, role) of every process that has a role (not the shell, kernel threads, ...): one scan."""
    procs, _own, roles = _roles(loadgen_pid)
    return [(pid, p, role) for pid, p in procs.items() if (role := roles.get(pid)) is not None]


def _cpu_seconds(p: psutil.Process) -> float | None:
    try:
        t = p.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return t.user + t.system


def _waited_seconds(pid: int, proc: str) -> float | None:
    """The run-queue wait of ``pid``'s threads alive now (schedstat's second field, summed), or None if gone."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    waited_ns = 0
    for tid in tids:
        try:
            with open(f"{proc}/{pid}/task/{tid}/schedstat") as f:
                waited_ns += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread ended meanwhile
    return waited_ns / 1e9


def snapshot(loadgen_pid: int | None = None) -> Snapshot:
    """pid -> (role, cpu seconds so far) for every process we can read."""
    return {
        pid: (role, cpu) for pid, p, role in _benchmark_processes(loadgen_pid) if (cpu := _cpu_seconds(p)) is not None
    }


def wait_snapshot(loadgen_pid: int | None = None, proc: str = "/proc") -> Snapshot:
    """pid -> (role, seconds its threads have waited in a run queue so far: runnable, not running), the sum over
    the threads alive now (``/proc/<pid>/task/<tid>/schedstat``'s second field). A thread that ends between two
    snapshots takes its wait with it, so a delta is a lower bound where threads come and go."""
    return {
        pid: (role, waited)
        for pid, _p, role in _benchmark_processes(loadgen_pid)
        if (waited := _waited_seconds(pid, proc)) is not None
    }


def snapshots(loadgen_pid: int | None = None, proc: str = "/proc") -> tuple[Snapshot, Snapshot]:
    """:func:`snapshot` and :func:`wait_snapshot` from one scan of the processes (the scan, every process's
    title and parent, is the costly part; a run's edges read both)."""
    cpu: Snapshot = {}
    waits: Snapshot = {}
    for pid, p, role in _benchmark_processes(loadgen_pid):
        if (seconds := _cpu_seconds(p)) is not None:
            cpu[pid] = (role, seconds)
        if (waited := _waited_seconds(pid, proc)) is not None:
            waits[pid] = (role, waited)
    return cpu, waits


def resolve_roles(own: dict[int, str | None], parent: dict[int, int]) -> dict[int, str | None]:
    """Each pid's role: its own (an engine qualified by whose engine it is), else its parent's, recursively.

    ``own`` maps pid -> the role its title names (or None), ``parent`` pid ->
    parent pid. An EngineCore under a Serve replica becomes ``EngineCore of
    replica <app>:<deployment>``, and its worker processes inherit that.
    """
    roles: dict[int, str | None] = {}

    def role_of(pid: int, depth: int = 0) -> str | None:
        if pid in roles:
            return roles[pid]
        up = parent.get(pid, 0)
        above = role_of(up, depth + 1) if up > 1 and up in own and depth < 64 else None
        mine = own.get(pid)
        if mine == "EngineCore" and above:
            mine = f"EngineCore of {above}"
        roles[pid] = mine or above
        return roles[pid]

    for pid in own:
        role_of(pid)
    return roles


def delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process born in between counts from zero)."""
    out: dict[str, float] = {}
    for pid, (role, cpu) in after.items():
        start = before.get(pid, (role, 0.0))[1]
        out[role] = out.get(role, 0.0) + max(0.0, cpu - start)
    return out


def per_request(cpu: dict[str, float], requests: int, min_share: float = 0.01) -> dict[str, float]:
    """CPU milliseconds per request per role, dropping roles under ``min_share`` of the total."""
    total = sum(cpu.values()) or 1.0
    return {
        role: 1000 * s / requests for role, s in sorted(cpu.items(), key=lambda kv: -kv[1]) if s / total >= min_share
    }
