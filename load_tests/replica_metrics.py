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
the head node (:func:`discover_metrics_urls`).

Also a CLI printing a per-replica table from a live cluster::

    python -m load_tests.replica_metrics [--metrics-url URL ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from .prom_text import parse_samples

DISCOVERY_FILE = Path("/tmp/ray/prom_metrics_service_discovery.json")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")

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
    "vllm:prompt_token_accounting_violations": ("kind", "violations"),
    "vllm:prompt_token_accounting_corrections": ("kind", "corrections"),
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
        """The accounting identity at quiescence: parts >= 0 and summing to the total; cached <= total."""
        parts = {s: self.by_source.get(s, 0.0) for s in SOURCES}
        problems = [f"{k} = {v} < 0" for k, v in self.counters().items() if v < 0 or not math.isfinite(v)]
        if sum(parts.values()) != self.prompt_tokens:
            problems.append(f"local_compute + local_cache_hit + external_kv_transfer = {sum(parts.values()):g} "
                            f"!= prompt_tokens = {self.prompt_tokens:g} ({parts})")
        if self.prompt_tokens_cached > self.prompt_tokens:
            problems.append(f"prompt_tokens_cached = {self.prompt_tokens_cached:g} > prompt_tokens = {self.prompt_tokens:g}")
        return problems


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


def replica_counters(text: str, node: str = "") -> dict[str, ReplicaCounters]:
    """Parse one scrape (Prometheus text) into counters per replica.

    The replica key is Ray's ``ReplicaId`` (a plain vLLM server: ``vllm``);
    samples of several engines in one replica are summed.
    """
    out: dict[str, ReplicaCounters] = {}
    for (sample, labels), value in parse_samples(relevant_lines(text)).items():
        c = canonical(sample)
        if c is None:
            continue
        name, is_total = c
        lab = dict(labels)
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
    return out


def scrape(urls: Iterable[str], client: httpx.Client | None = None, timeout: float = 10.0
           ) -> dict[str, ReplicaCounters]:
    """Scrape every URL; replicas from all of them (a replica lives on exactly one node)."""
    own = client is None
    client = client or httpx.Client(timeout=timeout)
    try:
        merged: dict[str, ReplicaCounters] = {}
        for url in urls:
            r = client.get(url)
            r.raise_for_status()
            for key, rc in replica_counters(r.text, node=url).items():
                if key in merged:
                    raise ValueError(f"replica {key} reported by two endpoints: {merged[key].node} and {url}")
                merged[key] = rc
        return merged
    finally:
        if own:
            client.close()


def discover_metrics_urls(path: Path = DISCOVERY_FILE) -> list[str]:
    """Every node's metrics endpoint, from the file Ray writes for Prometheus service discovery."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is a Ray cluster running on this machine? "
                                "Pass --metrics-url for each node instead.")
    groups = json.loads(path.read_text())
    return [f"http://{t}/metrics" for g in groups for t in g.get("targets", [])]


def print_table(replicas: dict[str, ReplicaCounters]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="prompt-token counters per replica")
    for col in ("replica", "node", "requests", "prompt_tokens", *SOURCES, "cached", "violations", "corrections",
                "sum check"):
        table.add_column(col, justify="left" if col in ("replica", "node", "sum check") else "right")
    for key in sorted(replicas):
        rc = replicas[key]
        problems = rc.sum_problems()
        table.add_row(key, rc.node, f"{rc.requests_total:g}", f"{rc.prompt_tokens:g}",
                      *(f"{rc.by_source.get(s, 0):g}" for s in SOURCES), f"{rc.prompt_tokens_cached:g}",
                      f"{sum(rc.violations.values()):g}", f"{sum(rc.corrections.values()):g}",
                      "ok" if not problems else "; ".join(problems))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics-url", action="append", default=[],
                    help="a node's metrics endpoint, e.g. http://127.0.0.1:8089/metrics (repeat per node); "
                         f"default: every node listed in {DISCOVERY_FILE}")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    urls = args.metrics_url or discover_metrics_urls()
    replicas = scrape(urls)
    if args.json:
        print(json.dumps({k: asdict(v) for k, v in replicas.items()}, indent=2))
    else:
        print_table(replicas)
    if not replicas:
        print(f"no vLLM counters at {', '.join(urls)} (no traffic yet? Ray exports a counter after its first increment)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
