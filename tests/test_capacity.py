"""The capacity search (``--profile sweep``): its steps, when it stops, which step is the knee, and the search run
end to end through the CLI against ``testkit/echo_server.py``, where a broken counter must stop it."""

from __future__ import annotations

import pytest

from load_tests.judge.capacity import knee, stop_reason
from load_tests.plan.profiles import Profile, SweepPlan
from load_tests.results.models import Latency, Percentiles, SweepStep, Throughput
from testkit.echo_server import run_cli


def step(c: int, goodput: float, meets: bool = True, violations: int = 0, failures: int = 0, started: int = 100):
    none = Percentiles(count=0, requests=0, p50=None, p90=None, p95=None, p99=None, mean=None)
    return SweepStep(
        concurrency=c,
        t_start=0.0,
        wall_s=1.0,
        started=started,
        throughput=Throughput(
            completed=started,
            requests_per_s=goodput,
            output_tokens_per_s=0.0,
            slo_met=started,
            goodput_requests_per_s=goodput,
        ),
        latency_s=Latency(ttft=none, itl=none, tpot=none, e2e=none),
        slo_attainment=1.0,
        unexpected_failures=failures,
        violations=violations,
        violation_kinds=["decrease"] if violations else [],
        within_error_budget=failures <= 1,
        meets_slo=meets,
    )


def test_the_steps_double_up_to_the_top():
    assert SweepPlan(top=256).concurrencies() == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert SweepPlan(top=24).concurrencies() == [1, 2, 4, 8, 16, 24]
    assert SweepPlan(top=1).concurrencies() == [1]
    assert SweepPlan(top=10, factor=1.5).concurrencies() == [1, 2, 3, 5, 8, 10]
    assert SweepPlan.from_profile(Profile(kind="sweep", concurrency=64, step_s=5)).step_s == 5


def test_the_sweep_stops_once_goodput_stops_rising_or_a_step_breaks():
    plan = SweepPlan(top=256, patience=2, knee_within=0.05)
    rising = [step(1, 1.0), step(2, 2.0), step(4, 3.9)]
    assert stop_reason(rising, plan) is None
    assert stop_reason([*rising, step(8, 4.0)], plan) is None, "one step without a rise is within patience"
    reason = stop_reason([*rising, step(8, 4.0), step(16, 4.05)], plan)
    assert reason is not None and "stopped rising" in reason
    assert stop_reason([*rising, step(8, 4.0), step(16, 5.0)], plan) is None, "a new best resets the count"
    reason = stop_reason([*rising, step(8, 4.5, violations=1)], plan)
    assert reason is not None and "invariant" in reason
    reason = stop_reason([*rising, step(8, 4.5, failures=2)], plan)
    assert reason is not None and "failed" in reason


def test_the_knee_is_the_highest_load_near_the_best_goodput_that_meets_the_slo():
    plan = SweepPlan(knee_within=0.05)
    steps = [step(1, 1.0), step(2, 2.0), step(4, 3.9), step(8, 4.0), step(16, 3.85), step(32, 4.0, meets=False)]
    found = knee(steps, plan)
    assert found is not None and found.concurrency == 16  # 3.85 >= 0.95 x 4.0; 32 misses the SLO
    found = knee([*steps[:4], step(16, 3.7)], plan)
    assert found is not None and found.concurrency == 8  # 3.7 < 0.95 x 4.0
    assert knee([step(1, 1.0, meets=False)], plan) is None


def sweep_cli(tmp_path, **echo):
    return run_cli(tmp_path, ["--profile", "sweep", "--step-s", "1", "--scrape-interval", "0.2"], **echo)


def test_a_sweep_through_the_cli_names_the_knee_and_plots_it(tmp_path):
    code, summary = sweep_cli(tmp_path)
    assert code == 0, summary["failures"]
    cap = summary["capacity"]
    assert [s["concurrency"] for s in cap["steps"]] == [1, 2, 4, 8], cap["stopped_because"]
    # the echo server serves every stream at the same pace: goodput grows with the load, the knee is the top
    assert cap["knee"] == 8 and all(s["meets_slo"] and s["violations"] == 0 for s in cap["steps"])
    assert sum(s["started"] for s in cap["steps"]) == summary["started"]
    report = (tmp_path / "report.md").read_text()
    assert "## Capacity search" in report and "capacity.png" in report and (tmp_path / "capacity.png").exists()


@pytest.mark.parametrize("fault", ["decreasing_counter", "negative_counter"])
def test_a_counter_that_breaks_mid_sweep_stops_it_and_fails_the_run(tmp_path, fault):
    code, summary = sweep_cli(tmp_path, fault=fault, fault_after=3)
    assert code == 1 and summary["failures"]
    steps = summary["capacity"]["steps"]
    assert any(s["violations"] for s in steps) and "invariant" in summary["capacity"]["stopped_because"]
    assert len(steps) < 4, "the sweep stops at the step that broke"
