"""The typed results of a run (load_tests.results.models): a stable, documented schema; the verdict derived once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from load_tests.load.outcomes import FAILURE_OUTCOMES, OK_OUTCOMES, OUTCOMES
from load_tests.plan.scenarios import SCENARIOS
from load_tests.results.models import EXIT_FAILED, EXIT_PASSED, RunSummary, schema_json

REPO = Path(__file__).resolve().parents[1]


def test_the_documented_schema_is_the_models():
    """docs/summary.schema.json is what `python -m load_tests.results` prints: a shape change shows in review."""
    committed = (REPO / "docs" / "summary.schema.json").read_text()
    assert committed == schema_json(), "regenerate: python -m load_tests.results > docs/summary.schema.json"
    props = json.loads(committed)["properties"]
    assert {"passed", "failures", "outcomes", "schema_version"} <= set(props)
    assert set(props["outcomes"]["propertyNames"]["enum"]) == set(OUTCOMES) | {"lost"}


def test_outcomes_are_partitioned():
    assert set(OK_OUTCOMES) | set(FAILURE_OUTCOMES) == set(OUTCOMES) and not set(OK_OUTCOMES) & set(FAILURE_OUTCOMES)


def minimal(failures: list[str]) -> dict:
    pct = dict.fromkeys(("p50", "p90", "p95", "p99", "mean")) | {"count": 0, "requests": 0}
    return {
        "wall_s": 1.0,
        "started": 1,
        "outcomes": {"ok": 1},
        "throughput": {
            "completed": 1,
            "requests_per_s": 1.0,
            "output_tokens_per_s": 1.0,
            "slo_met": 1,
            "goodput_requests_per_s": 1.0,
        },
        "slo": {},
        "latency_s": dict.fromkeys(("ttft", "itl", "tpot", "e2e"), pct),
        "errors_by_kind": {},
        "errors_by_message": {},
        "errors_explained_by_faults": {},
        "ingress_retries": {"requests": 0, "refusals": {}, "answered": 0},
        "first_unexpected_errors": [],
        "bad_requests": {"sent": 0, "rejected_naming_the_field": 0, "problems": []},
        "faults": [],
        "invariants": {
            "ok": True,
            "violations": 0,
            "by_kind": {},
            "first_violation": None,
            "expected_accounting_violations": {},
            "scrapes": 2,
            "scrape_errors": [],
            "failed_scrapes": 0,
            "scrape_seconds": pct,
            "first_scrape_t": 0.0,
            "last_scrape_t": 1.0,
        },
        "replicas": {},
        "unexpected_replica_deaths": [],
        "planned_faults": [],
        "client_server": {
            "client_ok": 1,
            "client_cancelled": 0,
            "engine_completed": 1,
            "engine_finished": 1,
            "sent_past_router": 1,
        },
        "failures": failures,
        "scenario": SCENARIOS["chaos"].model_dump(),
    }


def test_the_verdict_and_the_exit_code_derive_from_the_failures():
    passed, failed = RunSummary.model_validate(minimal([])), RunSummary.model_validate(minimal(["x broke"]))
    assert passed.passed and passed.exit_code == EXIT_PASSED
    assert not failed.passed and failed.exit_code == EXIT_FAILED
    assert json.loads(failed.model_dump_json())["passed"] is False
    assert RunSummary.model_validate_json(failed.model_dump_json()) == failed, "summary.json reads back"
    with pytest.raises(ValidationError, match="no failures"):
        RunSummary.model_validate(minimal(["x broke"]) | {"passed": True})
    with pytest.raises(ValidationError):
        RunSummary.model_validate(minimal([]) | {"outcomes": {"fine": 1}})  # not an outcome


def test_a_scenario_records_its_planned_faults_and_reads_back():
    dumped = SCENARIOS["chaos"].model_dump()
    assert dumped["planned_faults"] == SCENARIOS["chaos"].planned_faults
    assert SCENARIOS["chaos"].model_validate(dumped) == SCENARIOS["chaos"]
    with pytest.raises(ValidationError, match="derived"):
        SCENARIOS["chaos"].model_validate(dumped | {"planned_faults": ["replica_kill"]})
