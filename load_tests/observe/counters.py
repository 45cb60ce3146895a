"""One replica's vLLM counters at one scrape (:class:`ReplicaCounters`), and which exported series fill which field.

Under Ray Serve each engine replica's ``RayPrometheusStatLogger`` records
vLLM's metrics as Ray metrics: ``vllm:prompt_tokens`` becomes
``ray_vllm_prompt_tokens_total`` with a ``ReplicaId`` label, served by Ray's
metrics agent of the replica's node on that node's metrics export port. A
plain vLLM server serves the same counters as ``vllm:prompt_tokens_total``
without ``ReplicaId``. Both are read into this one shape (the reading is
:mod:`load_tests.observe.scraper`'s; the rules over it are
:mod:`load_tests.observe.invariants`'). Data only: this module imports neither.

The metric names are the observability contract's (:mod:`serve_app.observability.contract`, which the shipped
Prometheus rules are written from); this module maps them onto :class:`ReplicaCounters`' fields.

Whether a replica is alive is read from the same data, so it works against
any deployment (``--url`` included). Under Serve the controller exports
``serve_deployment_replica_healthy{replica}`` (:data:`HEALTH_GAUGE`: 1
healthy, 0 once it is unhealthy or stopping; seen here: 0 about 10 s after a
SIGKILL), and that is the answer. Without it (a plain vLLM server, the echo
server's pretend replicas, or a scrape that missed the head node) a replica
is alive while its vLLM gauges are exported. That fallback is only sound
where gauges are kept while idle (prometheus_client keeps them); Ray's agent
drops a gauge series ~20 s after its last update, idle or dead, while it
keeps a dead replica's *counters* forever (ray issue #65892). So against
Ray, scrape every node, the head included.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from patches.definitions.metrics import CORRECTIONS_METRIC, INJECTIONS_METRIC, VIOLATIONS_METRIC
from serve_app.observability.contract import (
    GENERATION_TOKENS,
    ITL_SECONDS,
    PREEMPTIONS,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    PROMPT_TOKENS_CACHED,
    RAY_VLLM_PREFIX,
    REQUEST_SUCCESS,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
    TPOT_SECONDS,
    TTFT_SECONDS,
)

# The names are the observability contract's (serve_app.observability.contract), re-exported for the load tests'
# modules: Serve's health gauge and failed health checks per replica, and the parts that sum to vllm:prompt_tokens.
from serve_app.observability.contract import HEALTH_CHECK_FAILURES as HEALTH_CHECK_FAILURES
from serve_app.observability.contract import HEALTH_GAUGE as HEALTH_GAUGE
from serve_app.observability.contract import SOURCES as SOURCES

# canonical counter name (vLLM's, without _total) -> field of ReplicaCounters
COUNTERS = {
    PROMPT_TOKENS: "prompt_tokens",
    PROMPT_TOKENS_CACHED: "prompt_tokens_cached",
    GENERATION_TOKENS: "generation_tokens",
    PREEMPTIONS: "preemptions",
}
LABELLED = {  # canonical name -> (label, field holding {label value: count})
    PROMPT_TOKENS_BY_SOURCE: ("source", "by_source"),
    REQUEST_SUCCESS: ("finished_reason", "requests_finished"),
    VIOLATIONS_METRIC: ("kind", "violations"),  # the accounting patch's
    CORRECTIONS_METRIC: ("kind", "corrections"),
    INJECTIONS_METRIC: ("kind", "injections"),  # the kv_faults patch's: the faults a run injected
}
GAUGES = {REQUESTS_RUNNING: "running", REQUESTS_WAITING: "waiting"}
# vLLM's latency histograms -> the figure they time (ReplicaCounters.histograms' keys); only their buckets are read.
HISTOGRAMS = {TTFT_SECONDS: "ttft", ITL_SECONDS: "itl", TPOT_SECONDS: "tpot"}
BUCKET = "_bucket"
WANTED = frozenset((*COUNTERS, *LABELLED, *GAUGES, *HISTOGRAMS, *(h + BUCKET for h in HISTOGRAMS)))


def canonical(sample_name: str) -> tuple[str, bool] | None:
    """``ray_vllm_prompt_tokens_total`` / ``vllm:prompt_tokens_total`` -> (``vllm:prompt_tokens``, is_total)."""
    name = sample_name
    if name.startswith(RAY_VLLM_PREFIX):
        name = "vllm:" + name[len(RAY_VLLM_PREFIX) :]
    elif not name.startswith("vllm:"):
        return None
    is_total = name.endswith("_total")
    return (name[: -len("_total")] if is_total else name), is_total


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
    health_check_failures: float = 0.0  # Serve's failed health checks of it (read with the health gauge)
    # figure (HISTOGRAMS' values) -> {bucket's upper bound ``le``: observations at or under it}, cumulative
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)

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


def counters_from_samples(samples, node: str = "") -> dict[str, ReplicaCounters]:
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
        elif not is_total and name.endswith(BUCKET) and name[: -len(BUCKET)] in HISTOGRAMS and "le" in lab:
            buckets = rc.histograms.setdefault(HISTOGRAMS[name[: -len(BUCKET)]], {})
            le = float(lab["le"])  # "+Inf" included
            buckets[le] = buckets.get(le, 0.0) + value
        elif not is_total and name in GAUGES:
            setattr(rc, GAUGES[name], getattr(rc, GAUGES[name]) + value)
            rc.gauges = True
    return out
