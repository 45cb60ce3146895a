"""Run the real promtool on the project's rules, and build its unit-test files from compact cases.

promtool's unit tests (``promtool test rules``) compare an alert's labels
*and* annotations exactly. The rules' ``description`` and ``runbook`` are
static text, so :func:`rule_test_file` copies them from the rules file into
each expected alert; only the templated ``summary`` is written in a case, and
promtool checks that the template renders it.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from monitoring.files import RULES_FILE

from .tools import tool


@dataclass
class PromtoolResult:
    returncode: int
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def promtool(*args: str, timeout: float = 120) -> PromtoolResult:
    r = subprocess.run([str(tool("promtool")), *args], capture_output=True, text=True, timeout=timeout)
    return PromtoolResult(r.returncode, r.stdout + r.stderr)


def alerting_rules(rules_file: Path = RULES_FILE) -> dict[str, dict[str, Any]]:
    """alertname -> the rule (expr, for, labels, annotations) as written in the rules file."""
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


@dataclass
class Firing:
    """One alert expected to fire: its labels (without alertname and the rule's own labels) and summary."""

    labels: dict[str, str]
    summary: str


@dataclass
class AlertCase:
    """Input series, and for each alert checked at ``eval_time`` what must fire (an empty list: nothing)."""

    name: str
    series: dict[str, str]  # series selector -> promtool's expanding notation, e.g. "0+10x20"
    eval_time: str
    expect: dict[str, list[Firing]] = field(default_factory=dict)
    interval: str = "15s"


@dataclass
class ExprCase:
    """Input series and PromQL expressions that must each return exactly ``expect`` at ``eval_time``."""

    name: str
    series: dict[str, str]
    eval_time: str
    exprs: list[str]
    expect: list[dict[str, Any]] = field(default_factory=list)  # promtool exp_samples; [] means "empty result"
    interval: str = "15s"


def rule_test_file(cases: list[AlertCase | ExprCase], rules_file: Path = RULES_FILE) -> dict[str, Any]:
    """A promtool unit-test document: one test group per case."""
    rules = alerting_rules(rules_file)
    tests = []
    for case in cases:
        group: dict[str, Any] = {
            "name": case.name,
            "interval": case.interval,
            "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        }
        if isinstance(case, AlertCase):
            group["alert_rule_test"] = [
                {
                    "alertname": alert,
                    "eval_time": case.eval_time,
                    "exp_alerts": [_expected(rules[alert], f) for f in firings],
                }
                for alert, firings in case.expect.items()
            ]
        else:
            group["promql_expr_test"] = [
                {"expr": e, "eval_time": case.eval_time, "exp_samples": case.expect} for e in case.exprs
            ]
        tests.append(group)
    return {"rule_files": [str(rules_file.resolve())], "evaluation_interval": "15s", "tests": tests}


def _expected(rule: dict[str, Any], firing: Firing) -> dict[str, Any]:
    annotations = {**rule.get("annotations", {}), "summary": firing.summary}
    return {"exp_labels": {**firing.labels, **rule.get("labels", {})}, "exp_annotations": annotations}


def run_rule_tests(cases: list[AlertCase | ExprCase], rules_file: Path = RULES_FILE) -> PromtoolResult:
    """Write the cases as a promtool unit-test file next to nothing else, and run ``promtool test rules`` on it."""
    with tempfile.TemporaryDirectory(prefix="fuzzserve-promtool-") as d:
        path = Path(d) / "rules_test.yml"
        path.write_text(yaml.safe_dump(rule_test_file(cases, rules_file), sort_keys=False))
        return promtool("test", "rules", str(path))
