"""The Grafana dashboard: up to date with its generator, valid in Grafana's schema, and every query real.

"Real" three times over: every PromQL expression parses in promtool (as a
recording rule of a throwaway rules file: promtool has no other way to check a
bare expression); every expression returns data when promtool evaluates it
over the series a real deployment exported (tests/fixtures/monitoring/, ramped
so that rates see traffic), next to the project's recording rules; and every
series name in it is one that export or a recording rule defines (a wrong
name on the losing side of an ``or`` still returns data). Each checker is fed
a bad case too.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from monitoring import dashboard as dashboard_mod
from monitoring.files import DASHBOARD_FILE, RULES_FILE
from testkit.monitoring.fixtures import fixture_samples, ramped_series
from testkit.monitoring.grafana_schema import schema_problems
from testkit.monitoring.promtool import ExprCase, promtool, run_rule_tests

# Grafana's variables, replaced by what PromQL can evaluate: every replica, and a rate window
# longer than two of the fixture's 15 s steps.
VARIABLES = {"$replica": ".*", "$__rate_interval": "1m"}
LABEL_VALUES = re.compile(r"^label_values\((?P<metric>[^,]+),\s*\w+\)$")
# Every series name the dashboard may use starts so: Ray's export (ray_*) or the project's recording rules.
SERIES_NAME = re.compile(r'(?<![\w:"])((?:ray_|fuzzserve:)[A-Za-z0-9_:]*)')


def committed() -> dict:
    return json.loads(DASHBOARD_FILE.read_text())


def expressions(dash: dict) -> list[str]:
    """Every PromQL expression the dashboard sends: panel targets, and the metric of each label_values variable."""
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):
            m = LABEL_VALUES.match(query["query"])
            assert m, f"variable {var['name']}: only label_values(metric, label) queries are checked: {query}"
            exprs.append(m["metric"])
    return [substitute(e) for e in exprs]


def substitute(expr: str) -> str:
    for var, value in VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def parse_check(exprs: list[str], tmp_path: Path):
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard_exprs.yml"
    path.write_text(yaml.safe_dump(rules))
    return promtool("check", "rules", str(path))


def unknown_series(exprs: list[str]) -> set[str]:
    """Series names in ``exprs`` that neither the captured export nor a recording rule defines.

    The data check alone cannot see a wrong name on the losing side of an ``or``; this one can."""
    known = {name for name, _labels in fixture_samples()}
    known |= {
        r["record"] for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"] if "record" in r
    }
    return {name for e in exprs for name in SERIES_NAME.findall(e)} - known


def data_check(exprs: list[str]):
    """Each expression must return at least one sample over the captured series: ``absent(expr)`` must be empty."""
    case = ExprCase(
        "dashboard queries over the captured export",
        ramped_series(fixture_samples()),
        "9m",
        [f"absent({e})" for e in exprs],
        expect=[],
    )
    return run_rule_tests([case])


def test_committed_dashboard_is_what_the_generator_makes():
    assert DASHBOARD_FILE.read_text() == dashboard_mod.render(), "run: python -m monitoring.dashboard"


def test_dashboard_is_valid_in_grafanas_schema():
    assert schema_problems(committed()) == []


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda d: d.update(pannels=[]), "$.pannels: not a field"),
        (lambda d: d["panels"][1]["gridPos"].update(w="12"), "grid_pos.w: '12' is not a int"),
        (lambda d: d.update(graphTooltip=7), "graph_tooltip: 7 is not"),
        (lambda d: d["panels"][1]["options"]["legend"].update(displayMode="tabel"), "display_mode: 'tabel'"),
        (lambda d: d["panels"][1]["fieldConfig"]["defaults"]["custom"].update(drawStyle="squiggle"), "draw_style"),
        (
            lambda d: (
                d["panels"][1].update(datasource={"type": "nosuchdb"})
                or [t.pop("datasource") for t in d["panels"][1]["targets"]]
            ),
            "no known data-source type",
        ),
        (lambda d: d["panels"][1].update(gridPos=[0, 0, 12, 8]), "$.panels[1]"),
    ],
)
def test_the_schema_check_catches_a_broken_dashboard(edit, expected):
    bad = copy.deepcopy(committed())
    edit(bad)
    problems = schema_problems(bad)
    assert any(expected in p for p in problems), problems


def test_every_query_parses_in_promtool(tmp_path: Path):
    exprs = expressions(committed())
    assert len(exprs) >= 10
    r = parse_check(exprs, tmp_path)
    assert r.ok, r.output


def test_the_parse_check_catches_a_broken_query(tmp_path: Path):
    r = parse_check(["sum by (ReplicaId (rate(ray_vllm_prompt_tokens_total[1m]))"], tmp_path)
    assert not r.ok and "parse error" in r.output, r.output


def test_every_query_returns_data_from_a_real_deployments_series():
    r = data_check(expressions(committed()))
    assert r.ok, r.output


def test_every_series_a_query_names_is_exported_or_recorded():
    exprs = expressions(committed())
    assert unknown_series(exprs) == set()
    assert {"ray_vllm_prompt_tokens_by_source_total", "fuzzserve:prompt_tokens_unaccounted"} <= {
        n for e in exprs for n in SERIES_NAME.findall(e)
    }


def test_the_name_check_catches_a_wrong_name_the_data_check_misses():
    masked = "sum(ray_vllm_prompt_tokens_total) or sum(ray_vllm_prompt_tokenz_total)"
    assert data_check([masked]).ok
    assert unknown_series([masked]) == {"ray_vllm_prompt_tokenz_total"}


def test_the_data_check_catches_a_query_of_a_series_nobody_exports():
    """vLLM's running-requests gauge exists in a plain vLLM server's /metrics, but Ray's export has no vLLM gauges:
    a panel on it would stay empty, and this check says so."""
    r = data_check(["sum(ray_vllm_num_requests_running)"])
    assert not r.ok and "absent(sum(ray_vllm_num_requests_running))" in r.output, r.output
