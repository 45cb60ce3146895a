"""The capacity search (``--profile sweep``): where does the deployment stop giving more goodput, and does accounting
hold all the way there?

The peers' way (GuideLLM's ``sweep`` profile, AIPerf's SLA search), in
closed loop: fixed-concurrency steps of ``step_s`` seconds at 1, 2, 4, ...
requests in flight, up to the profile's ``concurrency``, on one deployment and
one monitor. Each step gets the run's figures (throughput, SLO goodput,
TTFT/TPOT p50/p99, errors) and its own invariant verdict: the violations the
monitor found while the step ran (a counter is exported every few seconds, so
a violation can show a scrape or two after the request that caused it, and
may be charged to the next step; the whole run's verdict counts every one).

The sweep stops after a step that broke an invariant or the error budget
(unexpected failures above ``error_budget`` of its requests), or once
``patience`` steps in a row have not raised the best goodput by more than
``knee_within`` (it has stopped rising). The **knee** is the highest load
whose goodput is within ``knee_within`` of the best and that meets the SLO:
at least ``slo_attainment`` of its complete answers met it
(:meth:`load_tests.plan.slo.Slo.met`), within the error budget, no
violation. The plan is :class:`load_tests.plan.profiles.SweepPlan`, the result
:class:`load_tests.results.models.Capacity`; pure functions here
(:func:`step_figures`, :func:`stop_reason`, :func:`knee`), and
:class:`load_tests.runner.sweep.SweepDriver` runs the steps inside
:func:`load_tests.runner.loop.run_load`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..load.client import RequestResult
from ..load.outcomes import FAILURE_OUTCOMES
from ..observe.monitor import Violation
from ..plan.profiles import SweepPlan
from ..plan.slo import Slo
from ..results.models import Capacity, SweepStep
from .figures import latency, throughput


def step_figures(
    results: Sequence[RequestResult],
    started: int,
    concurrency: int,
    t_start: float,
    wall_s: float,
    slo: Slo,
    violations: Sequence[Violation],
    plan: SweepPlan,
) -> SweepStep:
    """A step's :class:`SweepStep` from its requests' results and the violations seen while it ran."""
    tp = throughput(results, wall_s, slo)
    failures = sum(r.outcome in FAILURE_OUTCOMES for r in results) + max(0, started - len(results))
    within = failures <= plan.error_budget * max(started, 1)
    attainment = tp.slo_met / tp.completed if tp.completed else None
    return SweepStep(
        concurrency=concurrency,
        t_start=t_start,
        wall_s=wall_s,
        started=started,
        throughput=tp,
        latency_s=latency([r for r in results if r.outcome == "ok"]),
        slo_attainment=attainment,
        unexpected_failures=failures,
        violations=len(violations),
        violation_kinds=sorted({v.kind for v in violations}),
        within_error_budget=within,
        meets_slo=within and not violations and attainment is not None and attainment >= plan.slo_attainment,
    )


def stop_reason(steps: Sequence[SweepStep], plan: SweepPlan) -> str | None:
    """Why the sweep ends after the last of ``steps`` (None: it goes on)."""
    last = steps[-1]
    if last.violations:
        return f"{last.violations} invariant violation(s) at {last.concurrency} in flight: {last.violation_kinds}"
    if not last.within_error_budget:
        return (
            f"{last.unexpected_failures} of {last.started} requests failed at {last.concurrency} in flight "
            f"(budget {plan.error_budget:.0%})"
        )
    best_at = 0
    for i, s in enumerate(steps):
        if (
            s.throughput.goodput_requests_per_s
            > (1 + plan.knee_within) * steps[best_at].throughput.goodput_requests_per_s
        ):
            best_at = i
    if len(steps) - 1 - best_at >= plan.patience:
        return (
            f"goodput stopped rising: {plan.patience} step(s) after {steps[best_at].concurrency} in flight "
            f"none beat its {steps[best_at].throughput.goodput_requests_per_s:.2f} req/s by more than "
            f"{plan.knee_within:.0%}"
        )
    return None


def knee(steps: Sequence[SweepStep], plan: SweepPlan) -> SweepStep | None:
    """The highest load whose goodput is within ``knee_within`` of the best and that meets the SLO."""
    if not steps:
        return None
    best = max(s.throughput.goodput_requests_per_s for s in steps)
    fit = [s for s in steps if s.meets_slo and s.throughput.goodput_requests_per_s >= (1 - plan.knee_within) * best]
    return max(fit, key=lambda s: s.concurrency) if fit else None


def capacity(steps: Sequence[SweepStep], plan: SweepPlan, stopped_because: str) -> Capacity:
    k = knee(steps, plan)
    return Capacity(
        plan=plan,
        steps=list(steps),
        knee=k.concurrency if k else None,
        knee_goodput_requests_per_s=k.throughput.goodput_requests_per_s if k else None,
        best_goodput_requests_per_s=max((s.throughput.goodput_requests_per_s for s in steps), default=0.0),
        stopped_because=stopped_because,
    )
