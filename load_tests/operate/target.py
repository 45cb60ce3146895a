"""What a load run drives, and what it may do to it: the deployment's addresses, and its replicas' processes.

With a local cluster (the CLI deployed it) a :class:`LoadTarget` knows each
engine replica's ReplicaId and pid, listed through Ray's state API before and
after the load (under full load that API can take over a minute to answer).
During the load a replica is dead when its pid is gone: a process-table
lookup, cheap enough for every scrape. Without a local cluster (``--url``)
deaths are read from the scraped data alone (:mod:`load_tests.observe.monitor`), and
nothing can be killed.
"""

from __future__ import annotations

import ipaddress
import logging
import random
import socket
import time
from typing import Any
from urllib.parse import urlparse

import psutil

from serve_app.config.names import replica_id

from ..results.events import ReplicaKilled
from .local_cluster import QUERY_ERRORS, running

log = logging.getLogger("fuzzserve.load_tests")


class LoadTarget:
    """The base URL, the metrics endpoints and the API key of a deployment; with ``cluster``, its replicas."""

    def __init__(self, base_url: str, metrics_urls: list[str], api_key: str | None, cluster: Any = None):
        self.base_url, self.metrics_urls, self.api_key, self.cluster = base_url, metrics_urls, api_key, cluster
        self.pids: dict[str, int] = {}
        self.ever_listed: set[str] = set()
        self.killed: set[str] = set()
        self.listed_dead: list[str] = []  # listed by Ray's state API before or during the run, missing after it

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def list_replicas(self) -> dict[str, int] | None:
        """ReplicaId -> pid of the alive engine replicas (None without a local cluster or if Ray did not answer)."""
        if self.cluster is None:
            return None
        try:
            listed = {replica_id(a.get("name", "")): a["pid"] for a in self.cluster.replicas()}
        except QUERY_ERRORS as e:  # a failed state query is not a finding about the replicas
            log.warning("could not list replicas: %s", e)
            return None
        self.pids.update(listed)
        self.ever_listed |= set(listed)
        return listed

    def note_final_listing(self) -> None:
        """After the run: every replica Ray listed during it and no longer lists (whether or not the data saw it
        die) goes to ``listed_dead``."""
        final = self.list_replicas()
        if final is not None:
            self.listed_dead = sorted(self.ever_listed - set(final))

    def dead(self) -> frozenset[str]:
        """The replicas known dead now: a pid gone, or killed by the run."""
        return frozenset(k for k, pid in self.pids.items() if not running(pid)) | frozenset(self.killed)

    def kill_one(self, victims: dict[str, int], seed: int, t0: float) -> ReplicaKilled | None:
        """SIGKILL one of ``victims`` (ReplicaId -> pid, listed before the load) still running, picked by ``seed``;
        the event, or None when none could be killed."""
        alive = sorted(rid for rid, pid in victims.items() if running(pid))
        if not alive:
            log.error("no replica listed before the load is still running: nothing to kill")
            return None
        rid = random.Random(seed).choice(alive)
        try:
            psutil.Process(victims[rid]).kill()  # by pid: a replica of the cluster this run started
        except psutil.NoSuchProcess:
            log.error("replica %s (pid %d) exited before it could be killed", rid, victims[rid])
            return None
        self.killed.add(rid)
        event = ReplicaKilled(t=time.monotonic() - t0, replica=rid, pid=victims[rid])
        log.info("killed replica %s (pid %d) at %.0f s", rid, victims[rid], event.t)
        return event


def is_local(url: str) -> bool:
    """Whether every address ``url``'s host resolves to is this machine's."""
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    local = {ai[4][0] for ai in socket.getaddrinfo(socket.gethostname(), None)} | {"127.0.0.1", "::1"}
    return all(ipaddress.ip_address(a).is_loopback or a in local for a in addrs)
