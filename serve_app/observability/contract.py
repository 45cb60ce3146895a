"""The observability contract of a fuzzserve deployment: the metric names it exports, and the invariants that must
hold over them, each once, with the load tests' check and the Prometheus alert it becomes.

Two checkers judge the same counters: the load tests' monitor (``load_tests.observe``: Python, over scrapes taken
during a run) and the shipped Prometheus rules (``monitoring/prometheus/fuzzserve-rules.yml``: PromQL, on a live
cluster). Both read this module. The rules file is written from :data:`INVARIANTS` and :data:`RECORD_GROUPS` by
``python -m monitoring.rules``; ``counters.py`` and ``invariants.py`` of ``load_tests.observe`` take their names
and their checks' kinds and parameters from here; and ``tests/test_observability_contract.py`` feeds the same
planted series to each Python check and to its generated rule, and fails when one fires and the other does not.

Why here, in ``serve_app``: the contract is what a deployed ``serve_app`` exports (vLLM's counters through Ray's
metrics agent, Serve's own health and request counters, the guard's admitted-requests counter from
:mod:`serve_app.observability.fuzz_traffic`) and what must hold of it. Both of its readers may import ``serve_app`` (the
repository's import table, tests/test_layout.py), and ``monitoring`` no longer imports ``load_tests``.
``patches`` would be a home nearer to where the patches' names are born (:mod:`patches.definitions.metrics`, which this
module reads), but it is a vLLM plugin that knows nothing of Ray Serve, whose series half of the rules read.
Pure data: importing it imports no Ray and no vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from patches.definitions.metrics import CORRECTIONS_METRIC, LYING_CONNECTOR_KINDS, VIOLATIONS_METRIC
from serve_app.observability.fuzz_traffic import EXPORTED as ADMITTED
from serve_app.observability.fuzz_traffic import NEUTRAL_MODE

# --- names -------------------------------------------------------------------------------------------------------

# vLLM's counters and gauges, as vLLM names them (a plain vLLM server serves them as ``<name>_total``); under Ray
# Serve each replica's are exported as :func:`exported` names with a ``ReplicaId`` label.
PROMPT_TOKENS = "vllm:prompt_tokens"
PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"
PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # label "source"
GENERATION_TOKENS = "vllm:generation_tokens"
PREEMPTIONS = "vllm:num_preemptions"
REQUEST_SUCCESS = "vllm:request_success"  # label "finished_reason"
REQUESTS_RUNNING = "vllm:num_requests_running"  # gauges: Ray's export carries none (docs/monitoring.md)
REQUESTS_WAITING = "vllm:num_requests_waiting"
# vLLM's latency histograms (seconds), observed in each replica's frontend (vLLM's output processor) as the engine's
# outputs arrive: the server's own time to first token, time between tokens and time per output token, which the
# load tests set beside the client's (``load_tests.judge.server_latency``). Exported with ``_bucket`` / ``_sum`` /
# ``_count`` samples; ``le`` labels the bucket.
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
ITL_SECONDS = "vllm:inter_token_latency_seconds"
TPOT_SECONDS = "vllm:request_time_per_output_token_seconds"
# The parts of vllm:prompt_tokens_by_source that sum to vllm:prompt_tokens.
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
RAY_VLLM_PREFIX = "ray_vllm_"

# Serve's controller: 1 per healthy replica, 0 once it is unhealthy or stopping (label "replica" = ReplicaId).
HEALTH_GAUGE = "ray_serve_deployment_replica_healthy"
# Serve's controller: failed health checks per replica (label "replica"); it grows when a replica crashes, hangs or
# its node is lost, never when Serve stops a healthy replica (a redeploy, a scale-down). Ray cannot export 0: no
# series means no failure.
HEALTH_CHECK_FAILURES = "ray_serve_health_check_failures_total"
# Serve's per-deployment request and error counters (labels application, deployment, replica).
DEPLOYMENT_REQUESTS = "ray_serve_deployment_request_counter_total"
DEPLOYMENT_ERRORS = "ray_serve_deployment_error_counter_total"


def exported(name: str) -> str:
    """A vLLM counter's name as Ray's metrics agent exports it: ``vllm:prompt_tokens`` ->
    ``ray_vllm_prompt_tokens_total``."""
    return RAY_VLLM_PREFIX + name.removeprefix("vllm:") + "_total"


PROMPT = exported(PROMPT_TOKENS)
BY_SOURCE = exported(PROMPT_TOKENS_BY_SOURCE)
CACHED = exported(PROMPT_TOKENS_CACHED)
SUCCESS = exported(REQUEST_SUCCESS)
VIOLATIONS = exported(VIOLATIONS_METRIC)
CORRECTIONS = exported(CORRECTIONS_METRIC)
EVERY_VLLM_COUNTER = f"{RAY_VLLM_PREFIX}*_total"  # a family pattern, for the catalogue's ``families``

# The recording rules' names.
UNACCOUNTED = "fuzzserve:prompt_tokens_unaccounted"
VLLM_COUNTER = "fuzzserve:vllm_counter"
QUIESCENT = "fuzzserve:replica_quiescent"
ADMITTED_RATE = "fuzzserve:admitted_requests:rate5m"
FUZZED_SHARE = "fuzzserve:fuzzed_request_share:rate5m"

# --- the catalogue's shape ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordingRule:
    """A recording rule, and the comment written above it in the rules file."""

    name: str
    expr: str
    note: str = ""

    def rule(self) -> dict[str, Any]:
        return {"record": self.name, "expr": self.expr}


@dataclass(frozen=True)
class Alert:
    """An alerting rule: its expression, how long it must hold (``for``), severity and annotations. ``summary`` is a
    template; ``description`` and ``runbook`` are static text. ``note`` is the comment above it in the rules file."""

    name: str
    expr: str
    severity: Literal["critical", "warning"]
    summary: str
    description: str
    runbook: str
    for_: str | None = None
    note: str = ""

    def rule(self) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if self.for_:
            rule["for"] = self.for_
        rule["labels"] = {"severity": self.severity}
        rule["annotations"] = {"summary": self.summary, "description": self.description, "runbook": self.runbook}
        return rule


@dataclass(frozen=True)
class Check:
    """The load tests' twin of an alert (``load_tests.observe``).

    ``outcome`` says where the monitor (``InvariantChecker``) reports it: ``violation`` -- a ``Finding`` of this
    ``kind`` that fails the run; ``tally`` -- the checker's attribute named ``kind`` (``expected_violations``,
    ``deaths``, ``stale``), recorded for the verdict, which decides whether it was planned. ``when``: at every scrape
    (against the previous scrape of the same replica), or once at rest (the end-of-run scrape, replicas alive and
    idle). ``params``: what the Python check is parameterised by. ``differs``: where the check and the alert differ
    on purpose (tests/test_observability_contract.py plants the ones a series can show).
    """

    kind: str
    when: Literal["every scrape", "at rest"]
    outcome: Literal["violation", "tally"] = "violation"
    params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    differs: str = ""


@dataclass(frozen=True)
class Invariant:
    """One invariant: what it means, the families it reads, its load-test check (``None``: the load tests judge it
    elsewhere or not at all, said in ``unchecked``) and its alert."""

    meaning: str
    families: tuple[str, ...]
    alert: Alert
    check: Check | None = None
    unchecked: str = ""

    @property
    def name(self) -> str:
        return self.alert.name


def _params(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(kw)


# --- recording rules ---------------------------------------------------------------------------------------------

_SOURCES_RE = "|".join(SOURCES)
RECORD_GROUPS: tuple[tuple[str, tuple[RecordingRule, ...]], ...] = (
    (
        "fuzzserve-accounting-records",
        (
            RecordingRule(
                UNACCOUNTED,
                f"{PROMPT}\n"
                f"- (\n"
                f'    sum without (source) ({BY_SOURCE}{{source=~"{_SOURCES_RE}"}})\n'
                f"    or 0 * {PROMPT}\n"
                f"  )\n",
                "Prompt tokens a replica counted in vllm:prompt_tokens but in none of the\n"
                "three sources: 0 when the accounting identity holds. A source that never\n"
                "got a token has no series yet (Ray cannot export 0): the `or` makes a\n"
                "replica with no source series at all count as 0 parts, not vanish.",
            ),
            RecordingRule(
                VLLM_COUNTER,
                f'label_replace({{__name__=~"{RAY_VLLM_PREFIX}.+_total"}}, "counter", "$1", "__name__", "(.+)")',
                "Every vLLM counter of every replica, its name kept in a `counter` label:\n"
                "alerts drop __name__, and two counters of one replica must stay two alerts.",
            ),
            RecordingRule(
                QUIESCENT,
                f"changes({PROMPT}[2m]) == bool 0",
                "1 for a replica whose prompt-token counter has not moved for 2 minutes:\n"
                "nothing was admitted, so its counters should be at rest and consistent.",
            ),
        ),
    ),
    (
        "fuzzserve-traffic-records",
        (
            RecordingRule(
                ADMITTED_RATE,
                f"sum by (application, fuzz_mode, fuzz_strength) (rate({ADMITTED}[5m]))",
                "Requests the guard admitted per second, by application, fuzz mode\n"
                '("none" for s = 0) and strength decade (the smallest power of ten >= s),\n'
                "summed over the replicas (direct path) or router replicas (router path).",
            ),
            RecordingRule(
                FUZZED_SHARE,
                f"(\n"
                f'    sum by (application) (rate({ADMITTED}{{fuzz_mode!="{NEUTRAL_MODE}"}}[5m]))\n'
                f"    or 0 * sum by (application) (rate({ADMITTED}[5m]))\n"
                f")\n"
                f"/ sum by (application) (rate({ADMITTED}[5m]))\n",
                "The fuzzed share of an application's admitted requests (0..1). Ray\n"
                "exports a counter only from its first increment: with no fuzzed request\n"
                "yet the numerator has no series, and the `or` makes the share 0, not absent.",
            ),
        ),
    ),
)

# --- the invariants ----------------------------------------------------------------------------------------------

ALERT_GROUP = "fuzzserve-invariants"
_LYING = "|".join(LYING_CONNECTOR_KINDS)
_HEALTHY_BY_REPLICA = 'label_replace({}, "ReplicaId", "$1", "replica", "(.+)")'
_PATCH_ON = "FUZZSERVE_PATCHES_OFF must not name `accounting`"  # prose: patches.framework.switches.OFF_ENV's value

INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "A vLLM counter counts up from 0: never below 0 (nor NaN or infinite, on the Python side).",
        (EVERY_VLLM_COUNTER,),
        Alert(
            "FuzzserveCounterNegative",
            f"{VLLM_COUNTER} < 0",
            "critical",
            "{{ $labels.counter }} is negative ({{ $value }}) on replica {{ $labels.ReplicaId }}",
            "A vLLM counter can only count up from 0; a negative value means an engine fed it a negative amount "
            "(vLLM issue 36533) and the accounting patch did not catch it.",
            f"Check that the accounting patch is on ({_PATCH_ON}) "
            "and that the replica runs the vLLM version the patches were verified on. Read the replica's "
            'log for "accounting:" warnings, then restart the replica (its counters start again at 0).',
        ),
        Check(
            "negative",
            "every scrape",
            differs="The monitor also flags a NaN or infinite value; the rule's `< 0` is false for NaN.",
        ),
    ),
    Invariant(
        "A counter of one replica's life never decreases (a restarted replica is a new series: new ReplicaId).",
        (EVERY_VLLM_COUNTER,),
        Alert(
            "FuzzserveCounterWentBackwards",
            f"resets({VLLM_COUNTER}[15m]) > 0",
            "critical",
            "{{ $labels.counter }} went backwards {{ $value }} time(s) on replica {{ $labels.ReplicaId }} "
            "in 15 minutes",
            "A counter of one replica's life decreased. A restarted replica is a new series (new ReplicaId and "
            "WorkerId), so this is a decrease within one process, which only a negative increment can cause.",
            "Same cause as FuzzserveCounterNegative: check the accounting patch is on and look for "
            '"accounting:" warnings in the replica\'s log. If two exporters report the same series (two '
            "Prometheus jobs scraping one node with different relabelling), fix the scrape config.",
        ),
        Check(
            "decrease",
            "every scrape",
            differs="The monitor also flags a labelled counter that was > 0 and disappeared from a replica still "
            "exported; resets() cannot see a series end.",
        ),
    ),
    Invariant(
        "At rest, local_compute + local_cache_hit + external_kv_transfer = prompt_tokens on every replica.",
        (PROMPT, BY_SOURCE),
        Alert(
            "FuzzservePromptTokensDoNotSum",
            f"{UNACCOUNTED} != 0 and {QUIESCENT} == 1",
            "critical",
            "replica {{ $labels.ReplicaId }}: prompt_tokens minus its sources = {{ $value }} at rest",
            "At rest, local_compute + local_cache_hit + external_kv_transfer must equal prompt_tokens on every "
            "replica. While requests are admitted the parts can lag the total by one export; after 2 minutes without "
            "admissions and 1 more minute of mismatch, they cannot.",
            "A replica that died mid-step can leave a frozen mismatch (see FuzzserveReplicaSeriesStale): "
            "check whether the replica is still healthy. On a live replica, check the accounting patch "
            "is on and compare the replica's vllm:prompt_tokens_by_source with its log; file the numbers "
            "with the load test's report (python -m load_tests.observe.replica_metrics prints the same sum check).",
            for_="1m",
        ),
        Check(
            "sum_mismatch",
            "at rest",
            params=_params(sources=SOURCES),
            differs="Rest: the load tests check once, on the scrape after the load stopped and two idle scrapes more "
            "than one export apart agreed; the rule waits for 2 minutes without admissions and 1 more of mismatch.",
        ),
    ),
    Invariant(
        "At rest, prompt_tokens_cached (local cache hits + KV transfers) <= prompt_tokens.",
        (PROMPT, CACHED),
        Alert(
            "FuzzservePromptTokensCachedExceedTotal",
            f"({CACHED} > {PROMPT}) and {QUIESCENT} == 1",
            "critical",
            "replica {{ $labels.ReplicaId }}: more prompt tokens cached than prompted ({{ $value }})",
            "prompt_tokens_cached (local cache hits + KV transfers) cannot exceed prompt_tokens at rest.",
            "Same checks as FuzzservePromptTokensDoNotSum: accounting patch on, replica healthy, the "
            'replica\'s log for "accounting:" warnings.',
            for_="1m",
        ),
        Check("cached_exceeds_total", "at rest"),
    ),
    Invariant(
        "The accounting patch clamps nothing that vLLM itself computed: no violation of a kind a connector does not "
        "cause (any kind added later included).",
        (VIOLATIONS,),
        Alert(
            "FuzzserveAccountingViolation",
            f'{VIOLATIONS}{{kind!~"{_LYING}"}} > 0',
            "critical",
            "accounting patch clamped {{ $value }} x {{ $labels.kind }} on replica {{ $labels.ReplicaId }}",
            "The accounting patch caught prompt-token stats that broke the invariant inside vLLM (not a connector "
            "report) and clamped them. The counters stay safe, but vLLM computed something it should not have.",
            'Find the replica\'s log line "accounting: <kind> clamped" (logged once per kind and process, '
            "with the request and the numbers) and report it with the vLLM version. The counter is "
            "cumulative over the replica's life: the alert clears when the replica restarts.",
        ),
        Check(
            "accounting_violation",
            "every scrape",
            params=_params(connector_kinds=LYING_CONNECTOR_KINDS),
            differs="The monitor tolerates connector_kinds only in a run whose scenario injects a lying connector "
            "(Scenario.expected_violation_kinds); the rules always leave them to FuzzserveKVConnectorReportsRejected.",
        ),
    ),
    Invariant(
        "A KV connector reports only possible matches: the patch rejected none of its reports.",
        (VIOLATIONS,),
        Alert(
            "FuzzserveKVConnectorReportsRejected",
            f'{VIOLATIONS}{{kind=~"{_LYING}"}} > 0',
            "warning",
            "KV connector reported impossible matches on replica {{ $labels.ReplicaId }}: {{ $value }} x "
            "{{ $labels.kind }}",
            "The KV connector reported a matched-token count that cannot be (negative, beyond the prompt, not an "
            "integer, an async load of 0 tokens). The accounting patch replaced each with 0 (recompute), so outputs "
            "and counters are right, but the connector or its offload tier is misbehaving. Expected when kv_faults "
            "injects a lying connector.",
            "Check whether kv_faults is configured (kv_connector_extra_config.fuzzserve_faults): its "
            "lying_rate causes exactly these. Otherwise inspect the offload tier (kv_offloading_size, "
            "the connector's log) and the replica's \"accounting: connector_...\" log line.",
        ),
        # Expected under a lying connector: tallied, the verdict compares them with the faults it injected.
        Check(
            "expected_violations",
            "every scrape",
            "tally",
            params=_params(connector_kinds=LYING_CONNECTOR_KINDS),
            differs="Tallied only in a run that injects a lying connector (otherwise they are accounting_violation).",
        ),
    ),
    Invariant(
        "Accounting corrections (after a failed KV load, a preemption) stay a small share of finished requests.",
        (CORRECTIONS, SUCCESS),
        Alert(
            "FuzzserveAccountingCorrectionsHigh",
            f"sum without (kind) (rate({CORRECTIONS}[10m]))\n/ sum without (finished_reason) (rate({SUCCESS}[10m]))\n"
            "> 0.2\n",
            "warning",
            "replica {{ $labels.ReplicaId }}: {{ $value | humanizePercentage }} of finished requests needed their "
            "prompt-token stats corrected",
            "Corrections (after a failed KV load, after a preemption) are expected now and then; on more than a fifth "
            "of the requests for 15 minutes, KV loads are failing often or the KV pool is too small (a preemption "
            "storm). Accounting stays right; throughput does not.",
            "Split the rate by kind on the dashboard. after_load_failure: check the offload tier and the "
            "connector's log (and kv_faults' load_failure_rate if configured). after_preemption: the KV "
            "pool is too small for the load (raise VLLM_CPU_KVCACHE_SPACE / gpu_memory_utilization, or "
            "lower max_num_seqs).",
            for_="15m",
        ),
        unchecked="The load tests report corrections per replica (summary.json, report.md) and judge none: a run "
        "injects the failed loads that cause them.",
    ),
    Invariant(
        "A replica that died (failed Serve's health checks) is told apart from a live one, although Ray keeps "
        "exporting its series with their last values (Ray issue 65892).",
        (PROMPT, HEALTH_GAUGE, HEALTH_CHECK_FAILURES),
        Alert(
            "FuzzserveReplicaSeriesStale",
            f"max by (ReplicaId) ({PROMPT})\n"
            f"unless on (ReplicaId)\n"
            f"  {_HEALTHY_BY_REPLICA.format(f'{HEALTH_GAUGE} == 1')}\n"
            f"and on (ReplicaId)\n"
            f"  {_HEALTHY_BY_REPLICA.format(f'max_over_time({HEALTH_GAUGE}[30m]) == 1')}\n"
            f"and on (ReplicaId)\n"
            f"  {_HEALTHY_BY_REPLICA.format(f'max by (replica) ({HEALTH_CHECK_FAILURES}) > 0')}\n",
            "warning",
            "replica {{ $labels.ReplicaId }} died (failed Serve's health checks), but its vLLM counters are still "
            "exported",
            "A replica that was healthy within the last 30 minutes failed Serve's health checks and is not healthy "
            "any more, and Ray keeps exporting its series with their last values (Ray issue 65892). Sums over "
            "replicas still include its frozen counters, and its counters will never reach rest; a replica that died "
            "mid-step can also show a frozen FuzzservePromptTokensDoNotSum. Replicas Serve stopped on purpose (a "
            "redeploy, a scale-down) fail no health check and do not raise this.",
            "Check why the replica died (serve status; the replica's log under Ray's session_latest/logs, "
            "$RAY_TMPDIR/ray (/tmp/fzs-<uid>/ray with the project's environment; Ray's default /tmp/ray): "
            "EngineDeadError, an OOM kill). Serve starts a replacement with a new ReplicaId. The stale "
            "series go away only when the node's Ray metrics agent restarts; filter them out of sums with "
            "the dashboard's replica selector meanwhile.",
            for_="2m",
            note=(
                "Serve's controller sets a replica's health gauge to 0 when it stops it, and Ray keeps that\n"
                "series and the replica's counters. A replica Serve stopped on purpose (a redeploy, a scale-down)\n"
                "never failed a health check; one that died (crashed, hung, lost its node) did: only those count.\n"
                'And only replicas seen healthy within 30 minutes: the alert says "died recently", then resolves.'
            ),
        ),
        # The monitor's stale set: its deaths (below) and the replicas never seen alive, left out of the at-rest checks.
        Check(
            "stale",
            "every scrape",
            "tally",
            differs="The monitor's stale set also holds the replicas Serve retired on purpose (healthy 0, no failed "
            "health check): it leaves them out of the at-rest checks and the verdict judges whether the run planned "
            "them; the rule leaves them out.",
        ),
    ),
    Invariant(
        "A replica that failed Serve's health checks and is not healthy is a death (a redeploy or a scale-down is "
        "not).",
        (HEALTH_GAUGE, HEALTH_CHECK_FAILURES),
        Alert(
            "FuzzserveReplicaDied",
            "(\n"
            f"  max by (application, deployment, replica) (increase({HEALTH_CHECK_FAILURES}[30m]) > 0)\n"
            f"  or max by (application, deployment, replica) (\n"
            f"    {HEALTH_CHECK_FAILURES} unless {HEALTH_CHECK_FAILURES} offset 30m)\n"
            ")\n"
            f"unless on (replica) {HEALTH_GAUGE} == 1\n",
            "warning",
            "replica {{ $labels.replica }} of {{ $labels.application }}/{{ $labels.deployment }} failed Serve's "
            "health checks and is not healthy",
            "Serve's controller counted failed health checks for this replica within the last 30 minutes and does "
            "not report it healthy. Serve replaces it (a new ReplicaId); requests it held were cut. A redeploy or a "
            "scale-down never raises this. The alert resolves 30 minutes after the last failure.",
            'serve status says whether the replacement is up (or why it cannot be scheduled: "Resources '
            "required ... total resources available\"). Read the replica's log under Ray's session_latest/logs "
            "in $RAY_TMPDIR/ray (/tmp/fzs-<uid>/ray with the project's environment; Ray's default /tmp/ray) "
            "(EngineDeadError, an OOM kill) and, if a whole node went, ray list "
            "nodes and the node's raylet log.",
            for_="1m",
            note=(
                "Serve's failed health checks, per replica: they grow when a replica crashes, hangs or loses\n"
                "its node, never when Serve stops a healthy one. Unlike FuzzserveReplicaSeriesStale this needs\n"
                "nothing from the replica's node (a lost node's series are gone with it): the controller exports it."
            ),
        ),
        # The monitor's deaths: seen alive, then not healthy (or its series gone) in death_bound_scrapes scrapes in a
        # row.
        Check(
            "deaths",
            "every scrape",
            "tally",
            params=_params(death_bound_scrapes=2),
            differs="A replica Serve retired on purpose is a death to the monitor too (the verdict judges whether "
            "the run planned it: load_tests.judge); the rule needs a failed health check.",
        ),
    ),
    Invariant(
        "A Serve deployment's requests do not keep failing.",
        (DEPLOYMENT_ERRORS, DEPLOYMENT_REQUESTS),
        Alert(
            "FuzzserveDeploymentRequestsFailing",
            f"sum by (application, deployment) (rate({DEPLOYMENT_ERRORS}[5m]))\n"
            f"/ (\n"
            f"    sum by (application, deployment) (rate({DEPLOYMENT_ERRORS}[5m]))\n"
            f"    + sum by (application, deployment) (rate({DEPLOYMENT_REQUESTS}[5m]))\n"
            f"  )\n"
            f"> 0.1\n",
            "critical",
            "{{ $labels.application }}/{{ $labels.deployment }}: {{ $value | humanizePercentage }} of its requests "
            "raised errors over 5 minutes",
            "More than a tenth of a Serve deployment's requests raised errors for 2 minutes. For the engine "
            "deployment this is how stock vLLM's accounting bug shows on a live cluster (vLLM issue 36533) - a bad "
            "connector report kills EngineCore or the output handler before a counter can go wrong, so every later "
            "request on that replica fails, and Serve's replacements die the same way.",
            "Look at the engine replicas' logs for EngineDeadError, \"Counters can only be incremented by "
            'non-negative amounts" or an AssertionError in the scheduler: then check that the accounting '
            f"patch is on ({_PATCH_ON}). Otherwise the logs say which "
            "error; FuzzserveReplicaSeriesStale lists the replicas that died.",
            for_="2m",
        ),
        unchecked="The load tests see failed requests at the client (every request's outcome in requests.jsonl, "
        "judged by the verdict), not in Serve's counters.",
    ),
)

CHECKS: Mapping[str, Check] = MappingProxyType({i.check.kind: i.check for i in INVARIANTS if i.check is not None})

RULES_HEADER = """\
Prometheus rules for a fuzzserve deployment: the load tests' counter invariants
(load_tests/observe/monitor.py), checked on a live cluster. docs/monitoring.md explains
each rule; tests/test_monitoring_rules.py runs promtool's unit tests on them.

Generated from serve_app/observability/contract.py by `python -m monitoring.rules`: edit that, not this file.

Series: Ray's metrics agent on every node exports each engine replica's vLLM
metrics as ray_vllm_* with a ReplicaId label (plus Ray's WorkerId, NodeAddress,
SessionName ... and Prometheus' instance/job). A restarted replica has a new
ReplicaId and WorkerId, so a restart is a new series, never a reset. Ray cannot
export a counter at 0: a counter series appears at its first increment. A dead
replica's series stay exported with their last values (Ray issue #65892)."""


def rule_groups() -> list[dict[str, Any]]:
    """The rules file's ``groups``: the recording rules, then every invariant's alert."""
    groups = [{"name": name, "rules": [r.rule() for r in records]} for name, records in RECORD_GROUPS]
    groups.append({"name": ALERT_GROUP, "rules": [i.alert.rule() for i in INVARIANTS]})
    return groups
