"""load_tests/report/operation_table.py: the row docs/load_tests.md keeps per operations run, from a run's results.

Pure logic over hand-made request lines: which span a request belongs to, what counts as refused, failed and
cut, and goodput judged by the run's own SLO."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from load_tests.load.client import RequestResult
from load_tests.load.outcomes import Outcome
from load_tests.plan.slo import Slo
from load_tests.plan.steps import Redeploy
from load_tests.report.operation_table import HEADER, WARMUP_S, operation_row
from load_tests.results.events import Redeployed


def line(start: float, outcome: Outcome = "ok", ttft: float | None = 0.1, e2e: float = 1.0) -> RequestResult:
    """A request as the table reads it: a line of requests.jsonl (RequestResult.to_json), read back."""
    r = RequestResult(
        index=0,
        outcome=outcome,
        start=start,
        ttft=ttft,
        e2e=e2e,
        completion_tokens=8,
        spec={"stream": True},
    )
    return RequestResult.from_json(json.loads(json.dumps(r.to_json())))


def test_a_request_line_reads_back_as_written():
    r = RequestResult(
        index=3,
        outcome="ok",
        status=200,
        start=1.5,
        ttft=0.2,
        e2e=1.6,
        itl=[0.1, 0.2],
        chunks=3,
        spec={"stream": True},
        ingress_refusals=["router_unreachable"],
    )
    back = RequestResult.from_json(json.loads(json.dumps(r.to_json())))
    assert back == r and back.tpot == pytest.approx(0.7) and back.output_tokens == 3
    with pytest.raises(TypeError, match="unknown"):
        RequestResult.from_json({**r.to_json(), "unknown": 1})


def summary(events, refused: int = 0, passed: bool = True):
    """What operation_row reads of a RunSummary (its other fields play no part)."""
    return SimpleNamespace(
        faults=events, passed=passed, ingress_retries=SimpleNamespace(requests=refused), slo=Slo(ttft_s=2.0, tpot_s=0.2)
    )


def redeploy(t: float, converged_t: float | None) -> Redeployed:
    return Redeployed(
        t=t,
        by="serve deploy",
        replicas_before=["a", "b"],
        converged=converged_t is not None,
        converged_t=converged_t,
        converge_s=None if converged_t is None else converged_t - t,
        replicas_after=["c", "d"],
        step=Redeploy(after_s=t),
    )


def test_spans_split_at_the_change_and_skip_the_warmup():
    rows = [
        line(1.0, ttft=50.0),  # warm-up: counted in requests, in no span
        *[line(WARMUP_S + i, ttft=0.2) for i in range(10)],  # before: 10 s of steady load, all met
        *[line(40.0 + i, ttft=3.0) for i in range(20)],  # during (40-60 s): slow first tokens, none met
        line(60.0, ttft=0.1),
    ]  # after convergence: in no span
    row = operation_row("r", summary([redeploy(40.0, 60.0)]), rows)
    assert row.requests == len(rows)
    assert row.ttft_p99_before_s == pytest.approx(0.2) and row.ttft_p99_during_s == pytest.approx(3.0)
    assert row.ttft_requests_during == 20
    assert row.goodput_before == pytest.approx(10 / (40.0 - WARMUP_S))
    assert row.goodput_during == 0.0
    assert row.converged_s == [20.0]


def test_refused_failed_and_cut_are_told_apart():
    rows = [
        line(20.0),
        line(45.0, "server_error", ttft=None),
        line(46.0, "transport_error", ttft=None),
        line(47.0, "cancelled", ttft=None),
        line(48.0, "rejected", ttft=None),
    ]
    row = operation_row("r", summary([redeploy(40.0, 60.0)], refused=1, passed=False), rows)
    assert (row.refused, row.failed, row.cut) == (1, 2, 1)
    md = row.markdown()
    assert "**FAILED**" in md and "| 1 | 2 / 1 |" in md and md.count("|") == HEADER.splitlines()[0].count("|")
    clean = operation_row("r", summary([redeploy(40.0, 60.0)]), [line(20.0), line(45.0)])
    assert (clean.refused, clean.failed, clean.cut) == (0, 0, 0) and "passed" in clean.markdown()


def test_a_step_that_never_converged_spans_to_the_last_request():
    rows = [line(20.0), line(50.0, ttft=5.0), line(90.0, ttft=7.0)]
    row = operation_row("r", summary([redeploy(40.0, None)]), rows)
    assert row.ttft_requests_during == 2 and row.ttft_p99_during_s == pytest.approx(7.0, rel=0.05)
    assert row.converged_s == [None] and "| - |" in row.markdown()


def test_a_run_that_changed_nothing_has_no_row():
    with pytest.raises(ValueError, match="changed nothing"):
        operation_row("r", summary([]), [line(20.0)])
