"""One observability contract (serve_app/observability/contract.py): the shipped rules file is written from it, and each
invariant's Python check and Prometheus alert give the same verdict on the same series.

* The committed rules file is what ``python -m monitoring.rules`` makes, and a catalogue change it lacks fails
  ``--check``.
* Twins: for every invariant with a load-test check, planted series (a counter going negative, one going backwards,
  parts short of the total at rest, ...) make both the Python check (the load-test monitor, fed the scrapes as it
  reads them) and the generated PromQL rule (promtool) fire, and a clean twin of the same series makes neither fire.
* A planted disagreement fails: a rule made looser in a copy of the rules file, or a Python check given other
  parameters than the catalogue's, and the twins no longer agree.
* The invariants without a load-test check say why, and those are exactly the two the load tests judge elsewhere.

promtool must be installed (scripts/install_promtool.sh, run by the bootstrap): without it these tests fail.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from load_tests.observe import invariants
from monitoring import rules
from monitoring.files import RULES_FILE
from serve_app.observability.contract import (
    BY_SOURCE,
    CACHED,
    HEALTH_CHECK_FAILURES,
    HEALTH_GAUGE,
    INVARIANTS,
    PROMPT,
    RECORD_GROUPS,
    SOURCES,
    SUCCESS,
    VIOLATIONS,
    Invariant,
    rule_groups,
)
from testkit.monitoring.fixtures import series_selector
from testkit.monitoring.promtool import alerting_rules
from testkit.monitoring.twins import Planted, promql_agrees, promql_fires, python_fires

BY_NAME = {i.name: i for i in INVARIANTS}
LABELS = {
    "ReplicaId": "r1",
    "WorkerId": "w1",
    "engine": "0",
    "model_name": "fixture",
    "instance": "127.0.0.1:8089",
    "job": "ray",
}
SERVE = {"application": "fuzzserve", "deployment": "LLMServer:fixture", "instance": "127.0.0.1:8089", "job": "ray"}


def vllm(name: str, replica: str = "r1", **extra: str) -> str:
    return series_selector(name, {**LABELS, "ReplicaId": replica, "WorkerId": f"w{replica}", **extra})


def serve(name: str, replica: str) -> str:
    return series_selector(name, {**SERVE, "replica": replica})


def const(v: float | None, n: int) -> list[float | None]:
    return [v] * n


def ramp(start: float, step: float, n: int) -> list[float | None]:
    return [start + step * i for i in range(n)]


def parts(n: int, local_compute=None, local_cache_hit=None, external_kv_transfer=None) -> dict[str, list]:
    values = dict(zip(SOURCES, (local_compute, local_cache_hit, external_kv_transfer), strict=True))
    return {
        vllm(BY_SOURCE, source=s): (v if isinstance(v, list) else const(v, n))
        for s, v in values.items()
        if v is not None
    }


def healthy(n: int, *replicas: str) -> dict[str, list]:
    """Serve's health gauge at 1 for each replica (the monitor's sign of a live replica)."""
    return {serve(HEALTH_GAUGE, r): const(1, n) for r in replicas}


def died(n: int, at: int) -> dict[str, list]:
    """Two replicas exporting prompt tokens, both healthy; r2 fails a health check at step ``at`` and is healthy no
    more, its counters frozen (Ray keeps them)."""
    return {
        vllm(PROMPT): const(500, n),
        vllm(PROMPT, "r2"): const(700, n),
        **healthy(n, "r1"),
        serve(HEALTH_GAUGE, "r2"): const(1, at) + const(0, n - at),
        serve(HEALTH_CHECK_FAILURES, "r2"): const(None, at) + const(1, n - at),
    }


N = 12  # 3 minutes: enough for the per-scrape checks
REST = 30  # 7.5 minutes: 2 minutes to rest, 1 more of mismatch, and some
VIOLATION_KIND = "negative_increment"  # vLLM's own: critical
CONNECTOR_KIND = "connector_negative"  # a lying connector's: a warning, expected by its scenarios

TWINS: dict[str, list[Planted]] = {
    "FuzzserveCounterNegative": [
        Planted("a counter below 0", {vllm(PROMPT): const(-3, N), **healthy(N, "r1")}, True),
        Planted("counters counting up from 0", {vllm(PROMPT): ramp(0, 10, N), **healthy(N, "r1")}, False),
    ],
    "FuzzserveCounterWentBackwards": [
        Planted(
            "a labelled counter going from 50 to 42",
            {vllm(SUCCESS, finished_reason="stop"): [0, 10, 20, 30, 40, 50, 42, 52, 62, 72], **healthy(10, "r1")},
            True,
        ),
        Planted(
            "a counter going backwards while others grow",
            {vllm(PROMPT): ramp(0, 100, N), vllm(CACHED): ramp(0, 10, 6) + ramp(40, 10, N - 6), **healthy(N, "r1")},
            True,
        ),
        Planted(
            "monotone counters, and a restart as a new ReplicaId",
            {
                vllm(SUCCESS, finished_reason="stop"): ramp(0, 10, 8) + const(None, 8),
                vllm(SUCCESS, "r2", finished_reason="stop"): const(None, 8) + ramp(0, 1, 8),
            },
            False,
        ),
    ],
    "FuzzservePromptTokensDoNotSum": [
        Planted(
            "parts 10 short of the total at rest",
            {vllm(PROMPT): const(100, REST), **parts(REST, 60, 30), **healthy(REST, "r1")},
            True,
        ),
        Planted(
            "prompt tokens and no source series at all", {vllm(PROMPT): const(100, REST), **healthy(REST, "r1")}, True
        ),
        Planted(
            "parts that sum at rest",
            {vllm(PROMPT): const(100, REST), **parts(REST, 60, 30, 10), **healthy(REST, "r1")},
            False,
        ),
        Planted(
            "parts lagging the total by one export while admitting, then catching up",
            {
                vllm(PROMPT): ramp(0, 100, 17) + const(1600, 20),
                **parts(37, [0, *ramp(0, 100, 16), *const(1600, 20)]),
                **healthy(37, "r1"),
            },
            False,
        ),
    ],
    "FuzzservePromptTokensCachedExceedTotal": [
        Planted(
            "120 cached of 100 prompted, at rest",
            {vllm(PROMPT): const(100, REST), vllm(CACHED): const(120, REST), **parts(REST, 100), **healthy(REST, "r1")},
            True,
        ),
        Planted(
            "40 cached of 100 prompted",
            {
                vllm(PROMPT): const(100, REST),
                vllm(CACHED): const(40, REST),
                **parts(REST, 60, 40),
                **healthy(REST, "r1"),
            },
            False,
        ),
    ],
    "FuzzserveAccountingViolation": [
        Planted("vLLM's own stats clamped", {vllm(VIOLATIONS, kind=VIOLATION_KIND): const(1, N)}, True),
        Planted(
            "a violation appearing mid-run",
            {vllm(PROMPT): ramp(0, 10, N), vllm(VIOLATIONS, kind=VIOLATION_KIND): const(None, 6) + const(2, 6)},
            True,
        ),
        Planted(
            "only a lying connector's reports rejected", {vllm(VIOLATIONS, kind=CONNECTOR_KIND): const(18, N)}, False
        ),
        Planted("no violation series", {vllm(PROMPT): ramp(0, 10, N)}, False),
    ],
    "FuzzserveKVConnectorReportsRejected": [
        Planted("a lying connector's reports rejected", {vllm(VIOLATIONS, kind=CONNECTOR_KIND): const(18, N)}, True),
        Planted("only vLLM's own stats clamped", {vllm(VIOLATIONS, kind=VIOLATION_KIND): const(1, N)}, False),
    ],
    "FuzzserveReplicaSeriesStale": [
        Planted("a replica that died 3 minutes ago, its series frozen", died(20, 8), True),
        Planted(
            "healthy replicas",
            {vllm(PROMPT): const(500, 20), vllm(PROMPT, "r2"): const(700, 20), **healthy(20, "r1", "r2")},
            False,
        ),
    ],
    "FuzzserveReplicaDied": [
        Planted("a replica that failed health checks and is not healthy", died(20, 8), True),
        Planted(
            "one failed health check of a replica that stays healthy",
            {
                vllm(PROMPT): const(500, 20),
                **healthy(20, "r1"),
                serve(HEALTH_CHECK_FAILURES, "r1"): const(None, 8) + const(1, 12),
            },
            False,
        ),
    ],
}
CASES = [pytest.param(alert, case, id=f"{alert}: {case.name}") for alert, cases in TWINS.items() for case in cases]


# --- the generated rules file ------------------------------------------------------------------------------------


def test_the_committed_rules_file_is_the_generated_one():
    assert rules.main(["--check"]) == 0, "run: python -m monitoring.rules"
    assert RULES_FILE.read_text() == rules.render()


def test_the_rules_file_holds_exactly_the_catalogue():
    """What Prometheus loads from the file is the catalogue's rules, nothing lost or reordered by the writer."""
    assert yaml.safe_load(RULES_FILE.read_text())["groups"] == rule_groups()
    assert list(alerting_rules()) == [i.name for i in INVARIANTS]


def test_check_mode_fails_on_a_rules_file_the_catalogue_would_not_write(tmp_path: Path, monkeypatch):
    stale = tmp_path / "rules.yml"
    stale.write_text(RULES_FILE.read_text().replace("fuzzserve:vllm_counter < 0", "fuzzserve:vllm_counter < -5"))
    monkeypatch.setattr(rules, "RULES_FILE", stale)
    assert rules.main(["--check"]) == 1
    assert rules.main([]) == 0 and rules.main(["--check"]) == 0  # regenerated


# --- the catalogue -----------------------------------------------------------------------------------------------


def test_every_invariant_has_a_twin_or_says_why_not():
    assert len(BY_NAME) == len(INVARIANTS)
    for inv in INVARIANTS:
        assert inv.meaning and (inv.check is None) == bool(inv.unchecked), inv.name
    unchecked = {i.name for i in INVARIANTS if i.check is None}
    assert unchecked == {"FuzzserveAccountingCorrectionsHigh", "FuzzserveDeploymentRequestsFailing"}


def test_every_twin_has_a_positive_and_a_negative_control():
    checked = {i.name for i in INVARIANTS if i.check is not None}
    assert set(TWINS) == checked
    for alert, cases in TWINS.items():
        assert {c.fires for c in cases} == {True, False}, alert


def test_each_invariant_names_the_families_its_alert_reads():
    """A family of the catalogue's entry is in the alert's expression or in a recording rule that it reads."""
    records = {r.name: r.expr for _g, rs in RECORD_GROUPS for r in rs}
    for inv in INVARIANTS:
        text = inv.alert.expr + "".join(e for name, e in records.items() if name in inv.alert.expr)
        read = set(re.findall(r"\bray_[a-z0-9_]+", text))
        for family in inv.families:
            if "*" in family:  # a pattern: the regex on __name__ names its prefix
                assert family.split("*")[0] in text, (inv.name, family)
            else:
                assert family in read, (inv.name, family)


def test_the_python_checks_take_kinds_and_parameters_from_the_catalogue():
    assert invariants.SUM_MISMATCH is BY_NAME["FuzzservePromptTokensDoNotSum"].check
    assert invariants.NEGATIVE is BY_NAME["FuzzserveCounterNegative"].check


# --- the twins ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alert, case", CASES)
def test_the_python_check_and_the_alert_agree(alert: str, case: Planted):
    inv = BY_NAME[alert]
    verb = "fire" if case.fires else "stay silent"
    assert python_fires(inv, case) == case.fires, f"the load-test check of {alert} did not {verb} on {case.name}"
    r = promql_agrees(inv, case, case.fires)
    assert r.ok, f"{alert} did not {verb} on {case.name}:\n{r.output}"


def disagreements(inv: Invariant, rules_file: Path = RULES_FILE) -> list[str]:
    """The planted cases on which the Python check and the rule in ``rules_file`` disagree."""
    out = []
    for case in TWINS[inv.name]:
        py, prom = python_fires(inv, case), promql_fires(inv, case, rules_file)
        if py != prom:
            out.append(f"{case.name}: python {py}, promql {prom}")
    return out


# One edit per alert, each in the rules file alone: the rule no longer fires on a planted case its twin catches.
DRIFTS = {
    "FuzzserveCounterNegative": ("fuzzserve:vllm_counter < 0", "fuzzserve:vllm_counter < -5"),
    "FuzzserveCounterWentBackwards": (
        "resets(fuzzserve:vllm_counter[15m]) > 0",
        "resets(fuzzserve:vllm_counter[15m]) > 1",
    ),
    "FuzzservePromptTokensDoNotSum": (
        "fuzzserve:prompt_tokens_unaccounted != 0 and",
        "fuzzserve:prompt_tokens_unaccounted > 10 and",
    ),
    "FuzzservePromptTokensCachedExceedTotal": (
        "(ray_vllm_prompt_tokens_cached_total > ray_vllm_prompt_tokens_total)",
        "(ray_vllm_prompt_tokens_cached_total > 2 * ray_vllm_prompt_tokens_total)",
    ),
    "FuzzserveAccountingViolation": ('kind!~"connector_negative|', 'kind!~"negative_increment|connector_negative|'),
    "FuzzserveKVConnectorReportsRejected": ('kind=~"connector_negative|', 'kind=~"'),
    "FuzzserveReplicaSeriesStale": (
        "(ray_serve_health_check_failures_total) > 0,",
        "(ray_serve_health_check_failures_total) > 1,",
    ),
    "FuzzserveReplicaDied": (
        "unless on (replica) ray_serve_deployment_replica_healthy == 1",
        "unless on (replica) ray_serve_deployment_replica_healthy >= 0",
    ),
}


def test_every_twin_has_a_planted_drift():
    assert set(DRIFTS) == set(TWINS)


@pytest.mark.parametrize("alert", sorted(DRIFTS))
def test_a_rule_drifting_from_its_twin_is_caught(tmp_path: Path, alert: str):
    """A rule edited in the rules file alone: on some planted case the Python check fires and the rule does not."""
    wrong, right = DRIFTS[alert]
    text = RULES_FILE.read_text()
    assert text.count(wrong) == 1, wrong
    drifted = tmp_path / "rules.yml"
    drifted.write_text(text.replace(wrong, right))
    found = disagreements(BY_NAME[alert], drifted)
    assert found and all(f.endswith("python True, promql False") for f in found), (alert, found)


def test_a_python_check_drifting_from_its_twin_is_caught(monkeypatch):
    """The sum check given other parts than the catalogue's (external_kv_transfer dropped): a clean replica whose
    prompt tokens came partly over the KV connector now fails the Python check, and the twins disagree."""
    inv = BY_NAME["FuzzservePromptTokensDoNotSum"]
    assert inv.check is not None
    drifted = dataclasses.replace(inv.check, params={"sources": SOURCES[:2]})
    monkeypatch.setattr(invariants, "SUM_MISMATCH", drifted)
    assert disagreements(inv) == ["parts that sum at rest: python True, promql False"]


def test_where_the_twins_differ_on_purpose():
    """A replica Serve retired (a redeploy, a scale-down: healthy 0, no failed health check) is stale and dead to
    the load-test monitor, which leaves it out of the at-rest checks and lets the verdict judge whether the run
    planned it; the alerts stay silent, since an operator planned it. The catalogue says so at both checks
    (``Check.differs``)."""
    n = 20
    retired = {
        vllm(PROMPT): const(500, n),
        vllm(PROMPT, "r2"): const(700, n),
        **healthy(n, "r1"),
        serve(HEALTH_GAUGE, "r2"): const(1, 8) + const(0, n - 8),
    }
    case = Planted("a replica Serve retired", retired, False)
    for alert in ("FuzzserveReplicaSeriesStale", "FuzzserveReplicaDied"):
        inv = BY_NAME[alert]
        assert python_fires(inv, case) and promql_agrees(inv, case, False).ok, alert
        assert inv.check is not None and "retired on purpose" in inv.check.differs, alert


@pytest.mark.parametrize(
    "alert, case, differs",
    [
        (
            "FuzzserveCounterWentBackwards",
            Planted(
                "a labelled counter gone from a live replica",
                {
                    vllm(PROMPT): ramp(0, 10, N),
                    vllm(SUCCESS, finished_reason="stop"): ramp(0, 10, 6) + const(None, N - 6),
                    **healthy(N, "r1"),
                },
                False,
            ),
            "disappeared",
        ),
        (
            "FuzzserveCounterNegative",
            Planted("a NaN counter", {vllm(PROMPT): const(float("nan"), N), **healthy(N, "r1")}, False),
            "NaN",
        ),
    ],
)
def test_what_only_the_monitor_sees(alert: str, case: Planted, differs: str):
    """resets() cannot see a series end, and NaN < 0 is false: the monitor flags both, the rules do not (the
    catalogue says so: ``Check.differs``)."""
    inv = BY_NAME[alert]
    assert python_fires(inv, case) and promql_agrees(inv, case, False).ok
    assert inv.check is not None and differs in inv.check.differs
