"""The typed results of a run: :class:`RunSummary`, what ``summary.json`` holds and the exit code derives from.

``load_tests.judge.summary.summarize`` builds it, the CLI prints it and exits with
:attr:`RunSummary.exit_code`, ``load_tests.report`` writes it
(``summary.json`` is :meth:`RunSummary.model_dump_json`) and renders
``report.md`` from it. Its JSON schema is ``docs/summary.schema.json``
(``python -m load_tests.results`` prints it; a test keeps the committed file
equal): a consumer of ``summary.json`` reads it against that schema, and a
change to the shape bumps :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import json
from dataclasses import field
from typing import Any, Literal

from pydantic import Field, computed_field, model_validator
from pydantic.dataclasses import dataclass

from ..load.outcomes import Counted, Outcome
from ..observe.monitor import Violation
from ..plan.profiles import SweepPlan
from ..plan.scenarios import Scenario
from ..plan.slo import Slo
from .base import Record
from .events import Event

# 2: every percentile row counts what it covers; goodput judges every request; sweep, repeats.
# 3: ``faults`` holds typed events (each kind its own fields; no ``detail`` bag).
# 4: ``client_cost`` (the load generator's CPU and loop lag); a percentile row's ``note`` (ITL / TPOT withheld when
#    the client read chunks late); ``client_server`` per second, the engines' generated tokens beside the client's.
# 5: ``server_latency_s``, the server's own TTFT / ITL / TPOT from vLLM's histograms, beside the client's rows.
SCHEMA_VERSION = 5
# The CLI's exit codes: the run passed; the run failed (RunSummary.failures says why); usage or set-up error.
EXIT_PASSED, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass
class FaultCheck:
    """One planned fault: did it fire (``evidence``), and was it handled (``problems``) (load_tests.judge.evidence)."""

    fault: str
    fired: bool
    evidence: str
    problems: list[str] = field(default_factory=list)
    per_replica: dict[str, Any] = field(default_factory=dict)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return self.fired and not self.problems


@dataclass
class ProbeAnswer:
    """One greedy probe's answer (load_tests.plan.probes, load_tests.judge.probes)."""

    round: int
    index: int  # which probe
    t: float  # seconds since the run started
    text: str | None  # None: the request failed (its outcome says how)


class ProbeReference(Record):
    """The fault-free deployment's answers to the probe set, and what made them unusable (empty: stable)."""

    answers: list[ProbeAnswer]
    problems: list[str]


class ProbeVerdict(Record):
    """The greedy probes of a run against the fault-free deployment (``RunSummary.probes``)."""

    rounds: int
    sent: int
    compared: int
    equal: int
    failed: int = Field(description="probes that failed (judged with the other requests, not compared)")
    differing: list[dict[str, Any]] = Field(description="the first 10 answers that differ, with the reference's")
    problems: list[str]
    reference: list[ProbeAnswer] = Field(default_factory=list, description="the fault-free answers")


class Percentiles(Record):
    count: int = Field(description="values the row is computed over")
    requests: int | None = Field(description="requests those values come from (None: not a per-request figure)")
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    mean: float | None
    note: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="why the row's figures are withheld (None each): the client read token chunks late",
    )


class ServerPercentiles(Record):
    """A latency figure as vLLM's histogram over the run's window gives it (``load_tests.judge.server_latency``)."""

    count: int = Field(description="observations in the window (requests for TTFT / TPOT, token gaps for ITL)")
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None
    bucket_s: dict[str, tuple[float, float]] = Field(
        description="per percentile, the bucket it lies in (lower, upper bound): the figure is interpolated inside it"
    )


class ServerLatency(Record):
    """The server's own TTFT / ITL / TPOT over the run (seconds), beside the client's ``latency_s``."""

    source: str = Field(description="what the figures are read from, and how")
    ttft: ServerPercentiles
    itl: ServerPercentiles
    tpot: ServerPercentiles


class ClientCost(Record):
    """The load generator's own cost over the load's window (``load_tests.load.client_cost``)."""

    cpu_s: float = Field(description="this process's CPU seconds (load, monitor, operator)")
    cpu_s_per_request: float = Field(description="cpu_s per request started")
    loop_lag_s: Percentiles = Field(description="how late the event loop woke a 10 ms sleeper")
    runqueue_wait_s: float | None = Field(
        None, description="seconds the event loop's thread waited runnable for a CPU (the kernel's schedstat)"
    )
    lag_bound_s: float = Field(description="over this lag (p99) the client's ITL / TPOT are withheld")


class Throughput(Record):
    completed: int = Field(description="complete answers (outcome ok)")
    requests_per_s: float = Field(description="complete answers per second of load")
    output_tokens_per_s: float
    slo_met: int = Field(
        description="complete answers meeting the SLO under Slo.met's rule (streams on TTFT and "
        "TPOT, the rest on end-to-end time)"
    )
    goodput_requests_per_s: float = Field(description="slo_met per second of load")


class Latency(Record):
    """Seconds, over the requests that completed (outcome ok) and have the figure: TTFT and ITL the streams that
    produced a token, TPOT those with two or more, end-to-end every one (each row's ``requests`` says how many)."""

    ttft: Percentiles
    itl: Percentiles
    tpot: Percentiles
    e2e: Percentiles


class BadRequestProblem(Record):
    index: int
    status: int | None
    want_status: int | None
    want_param: str | None
    error_param: str | None
    error: str | None


class BadRequests(Record):
    sent: int
    rejected_naming_the_field: int
    problems: list[BadRequestProblem] = Field(description="the first 10 refused without the status or field expected")


class ScrapeError(Record):
    t: float
    url: str
    error: str
    planned: bool = Field(False, description="the endpoint's node was lost on purpose (a node-loss run)")


class Invariants(Record):
    ok: bool
    violations: int
    by_kind: dict[str, int]
    first_violation: Violation | None = Field(description="the first violation, with its full context")
    expected_accounting_violations: dict[str, float] = Field(
        description="accounting violations the planned faults cause (a lying connector): tallied, not failures"
    )
    scrapes: int
    scrape_errors: list[ScrapeError] = Field(description="the first 10")
    failed_scrapes: int
    scrape_seconds: Percentiles
    first_scrape_t: float | None
    last_scrape_t: float | None


class ReplicaRecord(Record):
    """One replica's last scraped counters, and what the monitor saw of its life."""

    stale: bool
    died_at: float | None
    first_alive_at: float | None
    node: str
    prompt_tokens: float
    by_source: dict[str, float]
    requests_finished: dict[str, float]
    preemptions: float
    violations: dict[str, float]
    corrections: dict[str, float]
    injections: dict[str, float]


class ClientServer(Record):
    """What the clients saw complete against what the engines counted
    (``load_tests.judge.summary.server_cross_check``)."""

    client_ok: int
    client_cancelled: int
    engine_completed: float
    engine_finished: float
    engine_generation_tokens: float = Field(
        0.0, description="tokens the engines generated over the run, cancelled and failed requests' included"
    )
    wall_s: float = Field(0.0, description="the load's window both rates below divide by")
    client_requests_per_s: float = Field(
        0.0, description="complete answers (as engine requests: prompts x n), the operations' included, per second"
    )
    engine_requests_per_s: float = Field(0.0, description="engine_completed per second of the same window")
    client_output_tokens_per_s: float = Field(0.0, description="output tokens of the complete answers per second")
    engine_output_tokens_per_s: float = Field(0.0, description="engine_generation_tokens per second")
    agrees: bool = Field(
        True,
        description="the client's requests/s within RATE_BOUND of the engines' (a cancelled stream the engine "
        "completed counts on the engines' side: the bound is checked against the client's range)",
    )
    sent_past_router: int
    operator_ok: int = Field(
        0,
        description="complete answers to the operations' own requests (a redeploy's guard "
        "probes, the scale steps' affinity checks), sent beside the load; "
        "counted with client_ok and sent_past_router",
    )
    problems: list[str] = Field(default_factory=list)
    note: str | None = Field(
        None, exclude_if=lambda v: v is None, description="present when a replica died: only the upper bound is checked"
    )


class SweepStep(Record):
    """One step of the capacity search (``load_tests.judge.capacity``): its figures and verdicts."""

    concurrency: int
    t_start: float = Field(description="seconds since the run started")
    wall_s: float
    started: int
    throughput: Throughput
    latency_s: Latency
    slo_attainment: float | None = Field(description="share of the complete answers that met the SLO")
    unexpected_failures: int = Field(description="failed requests (lost included), none being planned")
    violations: int = Field(description="invariant violations the monitor found during the step")
    violation_kinds: list[str]
    within_error_budget: bool
    meets_slo: bool = Field(description="attainment reached, within the error budget, no violation")


class Capacity(Record):
    """The capacity search's result (``summary.json``'s ``capacity``)."""

    plan: SweepPlan
    steps: list[SweepStep]
    knee: int | None = Field(
        description="the highest concurrency whose goodput is within knee_within of the best "
        "and that meets the SLO (None: no step did)"
    )
    knee_goodput_requests_per_s: float | None
    best_goodput_requests_per_s: float
    stopped_because: str


class Spread(Record):
    """One figure over repeated runs."""

    values: list[float | None] = Field(description="each run's, in order")
    median: float | None
    min: float | None
    max: float | None
    relative_spread: float | None = Field(description="(max - min) / median")


class Repeats(Record):
    """The same profile run several times on one deployment (``--repeat N``): each figure's median and spread."""

    runs: int
    passed: int = Field(description="runs with no failure (the whole passes only if every one did)")
    figures: dict[str, Spread]
    reports: list[str] = Field(description="each run's report directory")


class IngressRetries(Record):
    """Requests Serve's HAProxy refused before any replica saw them, and the client sent again
    (:mod:`load_tests.load.client`: only ``router_unreachable`` and ``unknown_replica_id``)."""

    requests: int = Field(description="requests refused at the ingress at least once")
    refusals: dict[str, int] = Field(description="refusals by X-Serve-Reason, every attempt counted")
    answered: int = Field(
        description="of those requests, the ones a retry got an answer for (any outcome but "
        "server_error); the rest are server_error and fail the run"
    )
    in_change_windows: int = Field(
        0,
        description="refused requests that started in a replica change's window "
        "(load_tests.judge.ingress): excused up to the budget",
    )
    outside_change_windows: int = Field(0, description="the rest: each fails the run")
    budget: int = Field(0, description="refused requests the changes may excuse")
    windows: list[list[float | None]] = Field(
        default_factory=list, description="each change's [start, end] (s; end null: open to the run's end)"
    )


class HostileWindow(Record):
    kind: Literal["calm", "hostile"]
    t_start: float = Field(description="seconds since the run started")
    t_end: float
    normal_started: int = Field(description="normal (not hostile) requests started in the window")
    normal_slo_met: int = Field(description="of those, complete answers meeting the SLO")
    goodput_requests_per_s: float = Field(description="normal_slo_met per second of the window")


class HostileVerdict(Record):
    """The hostile-client scenario (load_tests.plan.hostile): every hostile request and connection answered as it
    must be, and the normal clients' goodput under attack against the calm windows'."""

    requests: dict[str, dict[str, int]] = Field(
        description="per hostile kind: sent, answered as expected (refused with the status and the field or "
        "header named; the positive control's legal ones served), otherwise"
    )
    connections: dict[str, dict[str, Any]] = Field(
        description="per connection kind: opened, closed within the bound, the slowest close (s), the bound (s)"
    )
    windows: list[HostileWindow]
    calm_goodput_requests_per_s: float | None = Field(
        description="SLO-meeting normal requests per second over all calm windows"
    )
    hostile_goodput_requests_per_s: float | None = Field(description="the same over all hostile windows")
    goodput_drop: float | None = Field(description="1 - hostile / calm (negative: hostile windows did better)")
    block_drops: list[float] = Field(
        default_factory=list, description="the same drop within each ABBA block of four windows: the noise beside it"
    )
    goodput_drop_bound: float
    problems: list[str]


class RunSummary(Record):
    """A run's numbers and its verdict: ``passed`` exactly when ``failures`` is empty."""

    schema_version: Literal[5] = 5  # SCHEMA_VERSION
    wall_s: float
    started: int = Field(description="requests started (probes included); each ends as one outcome, or lost")
    outcomes: dict[Counted, int]
    throughput: Throughput
    slo: Slo
    latency_s: Latency
    server_latency_s: ServerLatency | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="the server's own TTFT / ITL / TPOT from vLLM's histograms over the same window (seconds)",
    )
    client_cost: ClientCost | None = Field(
        None, exclude_if=lambda v: v is None, description="the load generator's own CPU and loop lag"
    )
    errors_by_kind: dict[Outcome, int] = Field(description="failed requests not explained by a planned fault")
    errors_by_message: dict[str, int] = Field(description="the 5 most common messages of those, numbers blanked")
    errors_explained_by_faults: dict[Outcome, int]
    ingress_retries: IngressRetries
    first_unexpected_errors: list[dict[str, Any]] = Field(description="the first 5, as lines of requests.jsonl")
    bad_requests: BadRequests
    faults: list[Event] = Field(
        description="what the run did on purpose: replica kills, operation steps (load_tests.results.events)"
    )
    invariants: Invariants
    replicas: dict[str, ReplicaRecord]
    unexpected_replica_deaths: list[str]
    planned_faults: list[FaultCheck]
    client_server: ClientServer
    failures: list[str] = Field(description="why the run failed, one line per reason (empty: it passed)")
    scenario: Scenario | None = None
    patches_off: str | None = None
    probes: ProbeVerdict | None = Field(
        None, exclude_if=lambda v: v is None, description="greedy probes under faults vs a fault-free deployment (soak)"
    )
    capacity: Capacity | None = Field(
        None, exclude_if=lambda v: v is None, description="the capacity search (profile sweep): its steps and knee"
    )
    repeats: Repeats | None = Field(
        None, exclude_if=lambda v: v is None, description="--repeat N: every run's figures, their median and spread"
    )
    hostile: HostileVerdict | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="the hostile-client scenario's requests, connections and "
        "normal goodput, calm against hostile windows",
    )

    @model_validator(mode="before")
    @classmethod
    def _passed_is_derived(cls, data: Any) -> Any:
        """``summary.json`` carries ``passed`` for its reader; reading it back, it must agree with ``failures``."""
        if isinstance(data, dict) and "passed" in data:
            data = dict(data)
            if data.pop("passed") != (not data.get("failures")):
                raise ValueError("passed must be exactly 'no failures'")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return EXIT_PASSED if self.passed else EXIT_FAILED


def schema() -> dict[str, Any]:
    """The JSON schema of ``summary.json`` (docs/summary.schema.json)."""
    return RunSummary.model_json_schema(mode="serialization")


def schema_json() -> str:
    return json.dumps(schema(), indent=2) + "\n"
