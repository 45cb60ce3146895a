"""Which cores each engine replica's EngineCore may run on, read from ``/proc``: the evidence that the re-pin holds.

With ``engine_cores_per_replica`` each replica pins its EngineCore process to
the cores of its local rank, and re-pins it when Serve renumbers the
replicas after a scale step (:mod:`serve_app.engine.core_binding`). The replica's
own log says what it did; this reads what the kernel enforces: every
thread's ``Cpus_allowed_list`` in ``/proc/<pid>/task/<tid>/status`` of each
EngineCore process under a replica's process. An operations run records it
after every step (``event.ray["engine_cores"]``), beside the replica ids,
and :func:`overlapping` names replicas of one node whose engines share a
core while the node has a core for each (what the re-pin exists to avoid).
Local processes only: the clusters the load tests start run on this host.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from itertools import combinations
from pathlib import Path

import psutil

from serve_app.config.names import replica_id
from serve_app.engine.cpu_cores import ENGINE_CORE_NAME

PROC = Path("/proc")


def parse_cpu_list(text: str) -> set[int]:
    """The cores of a ``Cpus_allowed_list`` value (``0-2,5``)."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores


def thread_cores(pid: int, proc: Path = PROC) -> set[int] | None:
    """The union of the cores every thread of ``pid`` may run on (None if the process is gone)."""
    cores: set[int] = set()
    try:
        for status in (proc / str(pid) / "task").glob("*/status"):
            for line in status.read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    cores |= parse_cpu_list(line.split(":", 1)[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return cores or None


def engine_cores(replica_pid: int) -> dict[int, list[int]]:
    """EngineCore pid -> the sorted cores its threads may run on, for the engines under one replica's process."""
    try:
        children = psutil.Process(replica_pid).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for child in children:
        try:
            if not child.name().startswith(ENGINE_CORE_NAME):
                continue
        except psutil.Error:
            continue
        cores = thread_cores(child.pid)
        if cores is not None:
            out[child.pid] = sorted(cores)
    return out


def overlapping(cores_by_replica: Mapping[str, list[int]], node_cores: int) -> list[tuple[str, str]]:
    """Pairs of replicas (of one node) whose engines share a core although the node has one for each."""
    if len(cores_by_replica) > node_cores:
        return []  # more replicas than cores: sharing is the plan, not a fault
    return [(a, b) for (a, ca), (b, cb) in combinations(sorted(cores_by_replica.items()), 2) if set(ca) & set(cb)]


def engine_cores_view(replicas: list[dict]) -> dict[str, dict]:
    """Per engine replica (Ray's actor records: ``name``, ``pid``, ``node_id``): its node, its process, each
    EngineCore's cores; and per node the pairs of replicas whose engines overlap (:func:`overlapping`, against
    the cores the node's replica processes may use)."""
    out: dict[str, dict] = {"replicas": {}, "overlapping": {}}
    by_node: dict[str, dict[str, list[int]]] = {}
    node_cores: dict[str, int] = {}
    for a in replicas:
        rid, node, pid = replica_id(a.get("name", "")), a.get("node_id", "")[:8], a.get("pid")
        if not pid:
            continue
        engines = engine_cores(pid)
        out["replicas"][rid] = {"node": node, "pid": pid, "engines": {str(k): v for k, v in engines.items()}}
        by_node.setdefault(node, {})[rid] = sorted({c for cores in engines.values() for c in cores})
        with contextlib.suppress(psutil.Error, AttributeError):
            node_cores[node] = len(psutil.Process(pid).cpu_affinity() or [])
    for node, cores in by_node.items():
        pairs = overlapping(cores, node_cores.get(node, 0))
        if pairs:
            out["overlapping"][node] = pairs
    return out
