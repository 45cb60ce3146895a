"""Per-replica vLLM counters, scraped from Ray's metrics export on every node.

Under Ray Serve each engine replica's ``RayPrometheusStatLogger`` records
vLLM's metrics as Ray metrics: ``vllm:prompt_tokens`` becomes
``ray_vllm_prompt_tokens_total`` with a ``ReplicaId`` label, served by Ray's
metrics agent of the replica's node on that node's metrics export port. A
plain vLLM server serves the same counters as ``vllm:prompt_tokens_total``
without ``ReplicaId``. This module reads either into one shape:
``{replica key: ReplicaCounters}``.

Where to scrape: every node's metrics export port. Ray writes the list of
them for Prometheus to ``/tmp/ray/prom_metrics_service_discovery.json`` on
the head node (:func:`discover_metrics_urls`). One scrape of every node is
one :class:`Scrape` (:func:`merge_pages`, used by the sync :func:`scrape` and
the load-test monitor alike): the replicas, the endpoints that could not be
read, and any replica reported by two endpoints (an error: one replica lives
in one process on one node, so two endpoints reporting it means two series
are being mixed up).

Whether a replica is alive is read from the same data, so it works against
any deployment (``--url`` included). Under Serve the controller exports
``serve_deployment_replica_healthy{replica}`` (1 healthy, 0 once it is
unhealthy or stopping; seen here: 0 about 10 s after a SIGKILL), and that is
the answer. Without it (a plain vLLM server, the echo server's pretend
replicas, or a scrape that missed the head node) a replica is alive while
its vLLM gauges are exported. That fallback is only sound where gauges are
kept while idle (prometheus_client keeps them); Ray's agent drops a gauge
series ~20 s after its last update, idle or dead, while it keeps a dead
replica's *counters* forever (ray issue #65892). So against Ray, scrape
every node, the head included (the discovery file lists them all).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from patches.metrics import CORRECTIONS_METRIC, INJECTIONS_METRIC, VIOLATIONS_METRIC

from .invariants import SOURCES, negative, quiescence
from .prom_text import parse_samples

DISCOVERY_FILE = Path("/tmp/ray/prom_metrics_service_discovery.json")
# Serve's controller: 1 per healthy replica, 0 once it is unhealthy or stopping (label "replica" = ReplicaId).
HEALTH_GAUGE = "ray_serve_deployment_replica_healthy"

# canonical counter name (vLLM's, without _total) -> field of ReplicaCounters
COUNTERS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:prompt_tokens_cached": "prompt_tokens_cached",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:num_preemptions": "preemptions",
}
LABELLED = {  # canonical name -> (label, field holding {label value: count})
    "vllm:prompt_tokens_by_source": ("source", "by_source"),
    "vllm:request_success": ("finished_reason", "requests_finished"),
    VIOLATIONS_METRIC: ("kind", "violations"),  # the accounting patch's
    CORRECTIONS_METRIC: ("kind", "corrections"),
    INJECTIONS_METRIC: ("kind", "injections"),  # the kv_faults patch's: the faults a run injected
}
GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}


@dataclass
class ReplicaCounters:
    """One replica's (one vLLM engine's) counters at one scrape. Absent counters read as 0.

    Ray cannot export a counter at 0 (its ``Counter.inc`` refuses 0), so under
    Serve a counter appears only after its first increment.
    """

    replica: str
    node: str = ""
    prompt_tokens: float = 0.0
    prompt_tokens_cached: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    by_source: dict[str, float] = field(default_factory=dict)
    requests_finished: dict[str, float] = field(default_factory=dict)
    violations: dict[str, float] = field(default_factory=dict)
    corrections: dict[str, float] = field(default_factory=dict)
    injections: dict[str, float] = field(default_factory=dict)
    gauges: bool = False  # the replica's vLLM gauges were in this scrape
    healthy: float | None = None  # Serve's health gauge for it, when the controller's node was scraped

    @property
    def alive(self) -> bool:
        """Serve's health gauge says healthy; without one, its vLLM gauges are exported (see the module doc)."""
        return self.healthy > 0 if self.healthy is not None else self.gauges

    def counters(self) -> dict[str, float]:
        """Every cumulative counter, flattened to ``name{label}`` -> value (for monotonicity checks)."""
        flat = {f: getattr(self, f) for f in COUNTERS.values()}
        for _name, (_label, attr) in LABELLED.items():
            flat.update({f"{attr}{{{k}}}": v for k, v in getattr(self, attr).items()})
        return flat

    @property
    def requests_total(self) -> float:
        return sum(self.requests_finished.values())

    def sum_problems(self) -> list[str]:
        """Its counters' identities (load_tests.invariants: never negative; parts sum to the total), as messages.

        They hold once nothing is in flight; whether the replica is idle is
        :func:`load_tests.invariants.busy`'s question."""
        return [f.message for f in negative(self) + quiescence(self)]


def canonical(sample_name: str) -> tuple[str, bool] | None:
    """``ray_vllm_prompt_tokens_total`` / ``vllm:prompt_tokens_total`` -> (``vllm:prompt_tokens``, is_total)."""
    name = sample_name
    if name.startswith("ray_vllm_"):
        name = "vllm:" + name[len("ray_vllm_"):]
    elif not name.startswith("vllm:"):
        return None
    is_total = name.endswith("_total")
    return (name[: -len("_total")] if is_total else name), is_total


WANTED = frozenset((*COUNTERS, *LABELLED, *GAUGES))


def relevant_lines(text: str) -> str:
    """Only the lines of the families this module reads.

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


def counters_from_samples(samples: Iterable[tuple[str, bool, dict[str, str], float]], node: str = ""
                          ) -> dict[str, ReplicaCounters]:
    """Counters per replica from ``(canonical name, is_total, labels, value)`` samples.

    The replica key is Ray's ``ReplicaId`` (a plain vLLM server or an offline
    engine: ``vllm``); samples of several engines in one replica are summed.
    """
    out: dict[str, ReplicaCounters] = {}
    for name, is_total, lab, value in samples:
        key = lab.get("ReplicaId", "vllm")
        rc = out.setdefault(key, ReplicaCounters(replica=key, node=node))
        if is_total and name in COUNTERS:
            setattr(rc, COUNTERS[name], getattr(rc, COUNTERS[name]) + value)
        elif is_total and name in LABELLED:
            label, attr = LABELLED[name]
            d = getattr(rc, attr)
            d[lab.get(label, "")] = d.get(lab.get(label, ""), 0.0) + value
        elif not is_total and name in GAUGES:
            setattr(rc, GAUGES[name], getattr(rc, GAUGES[name]) + value)
            rc.gauges = True
    return out


def replica_counters(text: str, node: str = "") -> dict[str, ReplicaCounters]:
    """Parse one endpoint's Prometheus text into counters per replica (see :func:`counters_from_samples`)."""
    samples = []
    for (sample, labels), value in parse_samples(relevant_lines(text)).items():
        c = canonical(sample)
        if c is not None:
            samples.append((c[0], c[1], dict(labels), value))
    return counters_from_samples(samples, node)


def health_gauges(text: str) -> dict[str, float]:
    """Serve's per-replica health gauge (``replica`` label -> 1 healthy / 0 not) from one endpoint's text."""
    lines = [line for line in text.splitlines() if line.startswith(HEALTH_GAUGE) or line.startswith(f"# TYPE {HEALTH_GAUGE} ")]
    out: dict[str, float] = {}
    for (_name, labels), value in parse_samples("\n".join(lines) + "\n").items():
        replica = dict(labels).get("replica")
        if replica:
            out[replica] = min(value, out.get(replica, value))
    return out


@dataclass
class Scrape:
    """One scrape of every endpoint: replicas from all of them, what could not be read, what was reported twice."""

    replicas: dict[str, ReplicaCounters] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # endpoint -> why it could not be read
    duplicates: dict[str, list[str]] = field(default_factory=dict)  # replica -> the endpoints that all report it

    def problems(self) -> list[str]:
        return ([f"{url} could not be read: {err}" for url, err in self.errors.items()]
                + [f"replica {key} reported by {len(urls)} endpoints: {', '.join(urls)}"
                   for key, urls in self.duplicates.items()])


def merge_pages(pages: Iterable[tuple[str, str | BaseException]]) -> Scrape:
    """Build one :class:`Scrape` from each endpoint's text (or the error that stopped reading it).

    A replica lives in one process on one node, so it must come from exactly
    one endpoint; a replica reported by several is kept once (from the first)
    and listed in ``duplicates``, which every caller treats as an error.
    """
    out = Scrape()
    health: dict[str, float] = {}
    for url, page in pages:
        if isinstance(page, BaseException):
            out.errors[url] = f"{type(page).__name__}: {page}"[:300]
            continue
        try:
            found = replica_counters(page, node=url)
            health.update(health_gauges(page))
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


def scrape(urls: Iterable[str], client: httpx.Client | None = None, timeout: float = 10.0
           ) -> dict[str, ReplicaCounters]:
    """Every replica of every endpoint; raises ``ScrapeError`` if an endpoint failed or a replica came twice."""
    result = fetch(urls, client, timeout)
    if result.problems():
        raise ScrapeError("; ".join(result.problems()))
    return result.replicas


class ScrapeError(RuntimeError):
    pass


def discover_metrics_urls(path: Path = DISCOVERY_FILE) -> list[str]:
    """Every node's metrics endpoint, from the file Ray writes for Prometheus service discovery."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is a Ray cluster running on this machine? "
                                "Pass --metrics-url for each node instead.")
    groups = json.loads(path.read_text())
    return [f"http://{t}/metrics" for g in groups for t in g.get("targets", [])]


def table_check(rc: ReplicaCounters) -> tuple[str, list[str]]:
    """(what the table shows, the problems) for one replica of a single scrape.

    The same rules as the load test: never negative, and at rest (alive and
    idle) the parts sum to the total. A dead replica's last export died
    mid-flight and a busy one has requests in flight: only "never negative"
    applies to them.
    """
    problems = [f.message for f in negative(rc)]
    if not rc.alive:
        return ("; ".join(problems) or "dead: last export kept by Ray, sums not checked"), problems
    if rc.running or rc.waiting:
        return ("; ".join(problems) or "busy: sums checked at rest"), problems
    problems = rc.sum_problems()
    return ("; ".join(problems) or "ok"), problems


def print_table(replicas: dict[str, ReplicaCounters]) -> list[str]:
    """Print one row per replica; return every problem found."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="prompt-token counters per replica")
    for col in ("replica", "node", "alive", "requests", "prompt_tokens", *SOURCES, "cached", "violations",
                "corrections", "sum check"):
        table.add_column(col, justify="left" if col in ("replica", "node", "sum check") else "right")
    found = []
    for key in sorted(replicas):
        rc = replicas[key]
        shown, problems = table_check(rc)
        found += problems
        table.add_row(key, rc.node, "yes" if rc.alive else "no", f"{rc.requests_total:g}", f"{rc.prompt_tokens:g}",
                      *(f"{rc.by_source.get(s, 0):g}" for s in SOURCES), f"{rc.prompt_tokens_cached:g}",
                      f"{sum(rc.violations.values()):g}", f"{sum(rc.corrections.values()):g}", shown)
    Console().print(table)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics-url", action="append", default=[],
                    help="a node's metrics endpoint, e.g. http://127.0.0.1:8089/metrics (repeat per node); "
                         f"default: every node listed in {DISCOVERY_FILE}")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    urls = args.metrics_url or discover_metrics_urls()
    result = fetch(urls)
    replicas = result.replicas
    problems = result.problems() + [p for rc in replicas.values() for p in table_check(rc)[1]]
    if args.json:
        print(json.dumps({"replicas": {k: asdict(v) for k, v in replicas.items()}, "errors": result.errors,
                          "duplicates": result.duplicates, "problems": problems}, indent=2))
    else:
        print_table(replicas)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
    if not replicas and not problems:
        print(f"no vLLM counters at {', '.join(urls)} (no traffic yet? Ray exports a counter after its first increment)")
    # An unreadable endpoint, a replica reported twice or a broken invariant is an error, as in the load test.
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
