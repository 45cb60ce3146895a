"""An invariant's two checkers on the same planted series: its load-test check and its Prometheus alert.

A :class:`Planted` case is a few series, each a value per 15 s step (``None``: not exported at that step). The
Python side gets one scrape per step, rendered as the exposition text a node's metrics endpoint serves and read
the way the load tests read it (``load_tests.observe.scraper.merge_pages``), fed to the load-test monitor
(``InvariantChecker``): every scrape observed, the last one as the end-of-run scrape at rest when the check is an
at-rest one. The PromQL side gets the same values as promtool input series, and is asked whether the alert is
firing (``ALERTS{alertstate="firing"}``) at the last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from load_tests.observe.monitor import InvariantChecker, Snapshot
from load_tests.observe.scraper import merge_pages
from monitoring.files import RULES_FILE
from serve_app.observability.contract import Invariant

from .promtool import ExprCase, PromtoolResult, run_rule_tests

STEP_S = 15
NODE = "http://127.0.0.1:8089/metrics"


@dataclass
class Planted:
    """Series (selector -> value per step) and whether the invariant's checks must fire on them."""

    name: str
    series: dict[str, list[float | None]]
    fires: bool

    @property
    def steps(self) -> int:
        return max(len(v) for v in self.series.values())

    def promtool_values(self) -> dict[str, str]:
        return {s: " ".join("_" if v is None else f"{v:g}" for v in vals) for s, vals in self.series.items()}

    def pages(self) -> list[str]:
        """Each step's exposition text (the series exported at that step)."""
        return [
            "".join(f"{s} {vals[i]:g}\n" for s, vals in self.series.items() if i < len(vals) and vals[i] is not None)
            for i in range(self.steps)
        ]


def python_fires(invariant: Invariant, case: Planted) -> bool:
    """Whether the load-test monitor reports the invariant's check on the planted scrapes."""
    check = invariant.check
    assert check is not None, f"{invariant.name} has no load-test check: {invariant.unchecked}"
    checker = InvariantChecker(check.params.get("connector_kinds", ()))
    pages = case.pages()
    for i, page in enumerate(pages):
        scrape = merge_pages([(NODE, page)])
        snap = Snapshot(i * STEP_S, scrape.replicas, errors=scrape.errors, duplicates=scrape.duplicates)
        if i == len(pages) - 1 and check.when == "at rest":
            checker.check_quiescent(snap)
        else:
            checker.observe(snap)
    if check.outcome == "violation":
        return any(v.kind == check.kind for v in checker.violations)
    return bool(getattr(checker, check.kind))


def firing_query(alert: str) -> str:
    return f'clamp_max(count by (alertname) (ALERTS{{alertname="{alert}",alertstate="firing"}}), 1)'


def promql_agrees(invariant: Invariant, case: Planted, fires: bool, rules_file: Path = RULES_FILE) -> PromtoolResult:
    """promtool's verdict on "the alert is firing at the last step" (``fires``) or "it is not" (not ``fires``)."""
    alert = invariant.alert.name
    expect = [{"labels": f'{{alertname="{alert}"}}', "value": 1}] if fires else []
    eval_time = f"{(case.steps - 1) * STEP_S}s"
    expr_case = ExprCase(case.name, case.promtool_values(), eval_time, [firing_query(alert)], expect, f"{STEP_S}s")
    return run_rule_tests([expr_case], rules_file=rules_file)


def promql_fires(invariant: Invariant, case: Planted, rules_file: Path = RULES_FILE) -> bool:
    """Whether the invariant's alert (in ``rules_file``) is firing at the planted series' last step."""
    yes = promql_agrees(invariant, case, True, rules_file)
    if yes.ok:
        return True
    no = promql_agrees(invariant, case, False, rules_file)  # not firing, or promtool could not evaluate the case
    assert no.ok, f"promtool could not evaluate {case.name!r}:\n{yes.output}\n{no.output}"
    return False
