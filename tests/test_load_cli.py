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

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from testkit import echo_server
from testkit.echo_server import cli_args
from tests.console_records import json_records

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
    # issue 47: the client's rate beside the engines' own, and the client's own cost, in the summary and report
    assert cs["agrees"] and cs["engine_requests_per_s"] > 0 and cs["wall_s"] == summary["wall_s"]
    cost = summary["client_cost"]
    assert cost["cpu_s"] > 0 and cost["loop_lag_s"]["count"] > 10 and cost["lag_bound_s"] == 0.005
    report = (tmp_path / "report.md").read_text()
    assert "the client's own cost:" in report and "the engines' own counters" in report
    # summary.json is a RunSummary (docs/summary.schema.json): it reads back as one, unchanged
    from load_tests.results.models import RunSummary

    again = RunSummary.model_validate_json((tmp_path / "summary.json").read_text())
    assert again.model_dump(mode="json") == summary and again.exit_code == code


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_a_broken_target_fails_the_run_naming_what_broke(tmp_path, fault):
    code, summary = run_cli(tmp_path, fault)
    assert code == 1 and not summary["passed"]
    assert any(EXPECTED[fault] in f for f in summary["failures"]), summary["failures"]
    assert "**FAILED**" in (tmp_path / "report.md").read_text()


def test_a_replica_reported_by_two_endpoints_fails_the_run(tmp_path):
    code, summary = run_cli(tmp_path, extra_metrics=1)  # the same endpoint twice: every replica comes twice
    assert code == 1 and any("duplicate_replica" in f and "reported by 2 endpoints" in f for f in summary["failures"])


# What the CLI's console may hold (issue 70: the console is the report): its own log records, plain text;
# rich's tables; and the lines the CLI prints, each whole (a line wrapped by the console starts none of these).
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
TABLE_CHARS = "┏┃┡│└┌├╭╰━─┗┠╇┳┻┯┷"
CLI_LINES = ("smoke: ", "  target ", "report: ", "deployed in ")


def console_problems(text: str) -> list[str]:
    """The lines of a CLI run's console output that are not one of :data:`CLI_LINES`' kinds: a JSON log record (a
    library's, through Ray's formatter) or the rest of a line the console broke."""
    records = set(json_records(text))
    problems = [f"a JSON log record: {line}" for line in text.splitlines() if line in records]
    for line in text.splitlines():
        if not line.strip() or line in records:
            continue
        if LOG_RECORD.match(line) or line.lstrip()[:1] in TABLE_CHARS or line.startswith(CLI_LINES):
            continue
        if line.strip() in ("smoke: PASSED", "smoke: FAILED"):  # the summary table's centred title
            continue
        problems.append(f"a stray line: {line}")
    return problems


def test_the_console_checker_catches_a_json_record_and_a_broken_line():
    good = "2026-12-07 09:01:08,475 INFO fuzzserve.load_tests: load finished\nreport: /tmp/r.md\n│ requests │ 12 │"
    assert console_problems(good) == []
    planted_json = good + '\n{"asctime": "2026-12-07", "levelname": "INFO", "message": "HTTP Request: GET /"}'
    assert [p.split(":")[0] for p in console_problems(planted_json)] == ["a JSON log record"]
    planted_break = good + "\n  target http://127.0.0.1:8000, profile {'kind': 'fixed',\n'duration_s': 2.0}, metrics"
    assert [p.split(":")[0] for p in console_problems(planted_break)] == ["a stray line"]


@pytest.mark.parametrize("fault, code", [(None, 0), ("decreasing_counter", 1)])
def test_the_command_line_exit_code(tmp_path, fault, code):
    """`python -m load_tests` itself, as README and CI run it; its console (a pipe, 60 columns) holds progress and
    results only, each line whole."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testkit.echo_server",
            "--port",
            "0",
            "--itl-ms",
            "5",
            *(["--fault", fault] if fault else []),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    try:
        port = int(server.stdout.readline().rsplit(":", 1)[-1])
        proc = subprocess.run(
            [sys.executable, "-m", "load_tests", *cli_args(port, tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "COLUMNS": "60"},
        )
    finally:
        server.terminate()
        server.wait(30)
    assert proc.returncode == code, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("PASSED" if code == 0 else "decrease") in proc.stdout
    assert console_problems(proc.stdout + proc.stderr) == [], proc.stdout + proc.stderr


# ---------------------------------------------------------------- --url operations: the test is the operator


def run_redeploy_by_hand(tmp_path, monkeypatch, operator_acts: bool):
    """``--scenario redeploy-lite --url``: the CLI tells the operator when to redeploy and judges the step from
    the scraped data; this test is the operator (it redeploys the echo server when told, or never).

    The scenario's redeploy comes 6 s in and its load ends 5 s after the rollout (15 and 15 as shipped): the
    echo server's "replicas" change at once, and two of the guard's probes (every 5 s) still come before it."""
    import json
    import logging

    from load_tests import cli
    from load_tests.plan import scenarios

    lite = scenarios.SCENARIOS["redeploy-lite"]
    assert lite.operations is not None
    (step,) = lite.operations.steps
    plan = lite.operations.model_copy(update={"steps": (step.model_copy(update={"after_s": 6}),), "tail_s": 5})
    monkeypatch.setitem(scenarios.SCENARIOS, "redeploy-lite", lite.model_copy(update={"operations": plan}))

    server = echo_server.EchoThread(itl_ms=5, refused_xargs=("fuzzserve_probe",))
    # its server and port are set in the thread it starts; the class declares neither, so they read as Any here
    started: Any = server
    told = []

    class Operator(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("operator, at t ="):
                told.append(record.getMessage())
                if operator_acts:
                    server.loop.call_soon_threadsafe(started.server.redeploy, ("fuzzserve_probe",))

    handler = Operator()
    logging.getLogger("fuzzserve.load_tests").addHandler(handler)
    url = f"http://127.0.0.1:{started.port}"
    try:
        code = cli.main(
            [
                "--scenario",
                "redeploy-lite",
                "--url",
                url,
                "--metrics-url",
                f"{url}/metrics",
                "--concurrency",
                "8",
                "--mix",
                '{"bad": 0}',
                "--no-sweep",
                "--no-progress",
                "--scrape-interval",
                "0.3",
                "--settle-interval",
                "0.3",
                "--settle-timeout",
                "3",
                "--converge-timeout",
                "10",
                "--out",
                str(tmp_path),
            ]
        )
    finally:
        logging.getLogger("fuzzserve.load_tests").removeHandler(handler)
        server.close()
    return code, json.loads((tmp_path / "summary.json").read_text()), told


def test_a_redeploy_left_to_the_operator_is_told_and_judged_from_the_data(tmp_path, monkeypatch):
    code, summary, told = run_redeploy_by_hand(tmp_path, monkeypatch, operator_acts=True)
    assert len(told) == 1 and "serve deploy your config" in told[0] and "fuzzserve_probe" in told[0], told
    assert code == 0 and summary["passed"], summary["failures"]
    (fault,) = summary["faults"]
    assert fault["by"] == "operator" and fault["converged"]
    assert fault["replicas_before"] == ["echo-0", "echo-1"]
    assert fault["replicas_after"] == ["echo-2", "echo-3"]
    (check,) = summary["planned_faults"]
    assert check["ok"] and "refused naming it before" in check["evidence"], check


def test_a_redeploy_the_operator_never_does_fails_naming_the_step(tmp_path, monkeypatch):
    code, summary, told = run_redeploy_by_hand(tmp_path, monkeypatch, operator_acts=False)
    assert len(told) == 1 and code == 1
    assert any("did not converge" in f and "want 2 new ones" in f for f in summary["failures"]), summary["failures"]
