"""``--repeat N``: one deployment, N runs, each figure's median and spread; the whole fails if any run did."""

from __future__ import annotations

import json

from load_tests.judge.repeats import spread
from testkit.echo_server import run_cli


def test_spread():
    s = spread([10.0, 13.0, 7.0, None])
    assert (s.median, s.min, s.max) == (10.0, 7.0, 13.0)
    assert s.relative_spread is not None and abs(s.relative_spread - 0.6) < 1e-12
    assert s.values == [10.0, 13.0, 7.0, None]
    assert spread([None, None]).median is None


def run(tmp_path, **echo):
    return run_cli(tmp_path, ["--repeat", "2"], **echo)


def test_two_runs_report_each_figure_over_both(tmp_path):
    code, summary = run(tmp_path)
    assert code == 0, summary["failures"]
    rep = summary["repeats"]
    assert rep["runs"] == rep["passed"] == 2
    rps = rep["figures"]["requests_per_s"]
    assert len(rps["values"]) == 2 and rps["min"] <= rps["median"] <= rps["max"]
    for k in (1, 2):
        one = json.loads((tmp_path / f"run-{k}" / "summary.json").read_text())
        assert one["passed"] and one["throughput"]["requests_per_s"] == rps["values"][k - 1]
    assert "## 2 runs (2 passed)" in (tmp_path / "report.md").read_text()


def test_a_run_that_fails_fails_the_whole(tmp_path):
    # the fault starts after 20 requests: the first run already sees the counter drop
    code, summary = run(tmp_path, fault="decreasing_counter", fault_after=20)
    assert code == 1 and summary["repeats"]["passed"] < 2
    assert all(f.startswith("run ") for f in summary["failures"]) and any("decrease" in f for f in summary["failures"])
