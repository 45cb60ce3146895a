"""The stress-test CLI, end to end, against a target broken on purpose: it must exit 1 and say what broke.

The target is ``testkit/echo_server.py`` with ``/metrics``: two pretend
engine replicas whose counters it keeps exactly as an honest engine would,
until ``--fault`` breaks one thing after 20 requests. Each run goes through
the whole CLI (generator, monitor, verdict, report) with ``--url``, the mode
that targets an existing deployment; the healthy twin must exit 0, or the
failures would prove nothing. One run of each kind is a real
``python -m load_tests`` subprocess; the rest call ``cli.main`` in this
process (the same code, without a second interpreter start per case).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit import echo_server
from testkit.echo_server import cli_args

# fault -> what the report's failures must say
EXPECTED = {
    "decreasing_counter": "decrease at t =",
    "negative_counter": "first negative at t =",
    "sum_mismatch": "first sum_mismatch at t =",
    "accounting_violation": "first accounting_violation at t =",
    "lost_stream": "lost request(s)",
    "replica_dies": "died without the run killing them: echo-1 (seen dead from t =",
    "scrape_fails": "unreadable in 2 consecutive scrapes",
    "undercount": "engines completed",
    "stuck": "first not_quiescent at t =",
}


def run_cli(tmp_path, fault=None, extra_metrics=0):
    return echo_server.run_cli(tmp_path, extra_metrics=extra_metrics, fault=fault, fault_after=20)


def test_a_healthy_target_passes(tmp_path):
    code, summary = run_cli(tmp_path)
    assert code == 0 and summary["passed"], summary["failures"]
    assert set(summary["replicas"]) == {"echo-0", "echo-1"} and summary["outcomes"]["ok"] > 20
    cs = summary["client_server"]
    assert cs["problems"] == [] and "note" not in cs, "no replica died: the cross-check is exact"
    # summary.json is a RunSummary (docs/summary.schema.json): it reads back as one, unchanged
    from load_tests.results import RunSummary

    again = RunSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert again.model_dump(mode="json") == summary and again.exit_code == code


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_broken_target_fails_the_run_naming_what_broke(tmp_path, fault):
    code, summary = run_cli(tmp_path, fault)
    assert code == 1 and not summary["passed"]
    assert any(EXPECTED[fault] in f for f in summary["failures"]), summary["failures"]
    assert f"**FAILED**" in (tmp_path / "report.md").read_text()


def test_a_replica_reported_by_two_endpoints_fails_the_run(tmp_path):
    code, summary = run_cli(tmp_path, extra_metrics=1)  # the same endpoint twice: every replica comes twice
    assert code == 1 and any("duplicate_replica" in f and "reported by 2 endpoints" in f for f in summary["failures"])


@pytest.mark.parametrize("fault, code", [(None, 0), ("decreasing_counter", 1)])
def test_the_command_line_exit_code(tmp_path, fault, code):
    """`python -m load_tests` itself, as README and CI run it."""
    server = subprocess.Popen([sys.executable, "-m", "testkit.echo_server", "--port", "0", "--itl-ms", "5",
                               *(["--fault", fault] if fault else [])], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().rsplit(":", 1)[-1])
        proc = subprocess.run([sys.executable, "-m", "load_tests", *cli_args(port, tmp_path)], capture_output=True,
                              text=True, timeout=300)
    finally:
        server.terminate()
        server.wait(30)
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("PASSED" if code == 0 else "decrease") in proc.stdout
