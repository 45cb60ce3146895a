"""Reading every replica's counters out of the nodes' metrics endpoints: one :class:`Scrape` of every endpoint.

Where to scrape: every node's metrics export port. Ray writes the list of
them for Prometheus to ``prom_metrics_service_discovery.json`` in its temp
root on the head node (:func:`discovery_file`: ``$RAY_TMPDIR/ray``, the
project's private ``/tmp/fzs-<uid>/ray`` under ``scripts/env.sh``, Ray's
default ``/tmp/ray`` without it; :func:`discover_metrics_urls`). One scrape of every node is
one :class:`Scrape` (:func:`merge_pages`, used by the sync :func:`fetch` and
the load-test monitor alike): the replicas (:class:`load_tests.observe.counters.ReplicaCounters`),
the endpoints that could not be read, and any replica reported by two
endpoints (an error: one replica lives in one process on one node, so two
endpoints reporting it means two series are being mixed up).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serve_app.engine.cluster_env import ray_root

from .counters import HEALTH_CHECK_FAILURES, HEALTH_GAUGE, WANTED, ReplicaCounters, canonical, counters_from_samples
from .prom_text import parse_samples

DISCOVERY_NAME = "prom_metrics_service_discovery.json"


def discovery_file() -> Path:
    """Ray's service-discovery file for this process's environment (its temp root: :func:`ray_root`)."""
    return ray_root() / DISCOVERY_NAME


class ScrapeFailed(RuntimeError):
    """An endpoint could not be read, or two endpoints reported one replica (:func:`scrape`)."""


def relevant_lines(text: str) -> str:
    """Only the lines of the families :mod:`load_tests.observe.counters` reads.

    A node's export is over a megabyte under Serve (every histogram bucket of
    every replica and of Ray itself); parsing all of it costs a core for most
    of a second, which a 2-core machine under load cannot spare every two
    seconds. Dropping the other families first (a line filter, no parsing)
    leaves prometheus_client's parser a few kilobytes.
    """
    keep = []
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            name = parts[2] if len(parts) > 2 else ""
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
        c = canonical(name)
        if c is not None and c[0] in WANTED:
            keep.append(line)
    return "\n".join(keep) + "\n"


def replica_counters(text: str, node: str = "") -> dict[str, ReplicaCounters]:
    """Parse one endpoint's Prometheus text into counters per replica (see :func:`counters_from_samples`)."""
    samples = []
    for (sample, labels), value in parse_samples(relevant_lines(text)).items():
        c = canonical(sample)
        if c is not None:
            samples.append((c[0], c[1], dict(labels), value))
    return counters_from_samples(samples, node)


def health_gauges(text: str, name: str = HEALTH_GAUGE) -> dict[str, float]:
    """Serve's per-replica series ``name`` (``replica`` label -> value) from one endpoint's text: the health gauge
    (1 healthy / 0 not; the lowest where several series name one replica) or :data:`HEALTH_CHECK_FAILURES`."""
    lines = [line for line in text.splitlines() if line.startswith((name, f"# TYPE {name} "))]
    out: dict[str, float] = {}
    for (sample, labels), value in parse_samples("\n".join(lines) + "\n").items():
        replica = dict(labels).get("replica")
        if replica and sample.startswith(name):  # also a counter exported as name_total
            out[replica] = (
                min(value, out.get(replica, value)) if name == HEALTH_GAUGE else out.get(replica, 0.0) + value
            )
    return out


@dataclass
class Scrape:
    """One scrape of every endpoint: replicas from all of them, what could not be read, what was reported twice."""

    replicas: dict[str, ReplicaCounters] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # endpoint -> why it could not be read
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # replica -> the endpoints that all report it

    def problems(self) -> list[str]:
        return [f"{url} could not be read: {err}" for url, err in self.errors.items()] + [
            f"replica {key} reported by {len(urls)} endpoints: {', '.join(urls)}"
            for key, urls in self.duplicates.items()
        ]


def merge_pages(pages: Iterable[tuple[str, str | BaseException]]) -> Scrape:
    """Build one :class:`Scrape` from each endpoint's text (or the error that stopped reading it).

    A replica lives in one process on one node, so it must come from exactly
    one endpoint; a replica reported by several is kept once (from the first)
    and listed in ``duplicates``, which every caller treats as an error.
    """
    out = Scrape()
    health: dict[str, float] = {}
    failures: dict[str, float] = {}
    for url, page in pages:
        if isinstance(page, BaseException):
            out.errors[url] = f"{type(page).__name__}: {page}"[:300]
            continue
        try:
            found = replica_counters(page, node=url)
            health.update(health_gauges(page))
            failures.update(health_gauges(page, HEALTH_CHECK_FAILURES))
        except ValueError as e:  # the text is not Prometheus exposition: unreadable too
            out.errors[url] = f"unparsable: {e}"[:300]
            continue
        for key, rc in found.items():
            if key in out.replicas:
                out.duplicates.setdefault(key, [out.replicas[key].node]).append(url)
            else:
                out.replicas[key] = rc
    for key, rc in out.replicas.items():
        rc.healthy = health.get(key)
        rc.health_check_failures = failures.get(key, 0.0)
    return out


def fetch(urls: Iterable[str], client: httpx.Client | None = None, timeout: float = 10.0) -> Scrape:
    """Scrape every endpoint once (errors kept in the result, not raised)."""
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    pages: list[tuple[str, str | BaseException]] = []
    try:
        for url in urls:
            try:
                r = client.get(url)
                r.raise_for_status()
                pages.append((url, r.text))
            except httpx.HTTPError as e:
                pages.append((url, e))
    finally:
        if own:
            client.close()
    return merge_pages(pages)


def scrape(
    urls: Iterable[str], client: httpx.Client | None = None, timeout: float = 10.0
) -> dict[str, ReplicaCounters]:
    """Every replica of every endpoint; :class:`ScrapeFailed` if an endpoint failed or a replica came twice."""
    result = fetch(urls, client, timeout)
    if result.problems():
        raise ScrapeFailed("; ".join(result.problems()))
    return result.replicas


def discover_metrics_urls(path: Path | None = None) -> list[str]:
    """Every node's metrics endpoint, from the file Ray writes for Prometheus service discovery
    (default: :func:`discovery_file`)."""
    path = discovery_file() if path is None else path
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: is a Ray cluster running on this machine? Pass --metrics-url for each node instead."
        )
    groups = json.loads(path.read_text())
    return [f"http://{t}/metrics" for g in groups for t in g.get("targets", [])]
