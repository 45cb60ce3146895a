"""End to end through Serve: the chaos-lite scenario with the patches (passes, every planned fault fired) and
with stock accounting (``--patches-off accounting``: fails, and the report says why).

Each run is ``python -m load_tests --scenario chaos-lite``, which starts a
local Ray cluster, deploys serve_config.yaml with the scenario's faults (KV
load failures and delays, a lying connector, a KV pool small enough for a
preemption storm), drives a minute of the full request mix while scraping
every replica's counters, checks every invariant and planned fault, writes
the report and tears down. The test reads what it wrote. (This replaces the
smoke run CI used to make: the patched run checks everything it did, and
the faults on top.)
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.serve]


def chaos_lite(out, *extra: str) -> subprocess.CompletedProcess:
    from load_tests.operate.ports import free_port

    return subprocess.run(
        [
            sys.executable,
            "-m",
            "load_tests",
            "--scenario",
            "chaos-lite",
            "--out",
            str(out),
            "--http-port",
            str(free_port()),
            "--no-progress",
            "--no-sweep",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )


@pytest.fixture(scope="module")
def patched_run(fixture_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos-lite-patched")
    return chaos_lite(out), out


@pytest.fixture(scope="module")
def stock_run(fixture_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("chaos-lite-stock")
    return chaos_lite(out, "--patches-off", "accounting"), out


def summary_of(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_with_the_patches_it_passes_and_every_planned_fault_fired(patched_run):
    proc, out = patched_run
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    summary = summary_of(out)
    assert summary["passed"] and summary["failures"] == []
    faults = {c["fault"]: c for c in summary["planned_faults"]}
    assert set(faults) == {"load_failures", "load_delays", "lying_connector", "preemption_storm"}
    assert all(c["fired"] and c["ok"] for c in faults.values()), faults
    assert summary["invariants"]["expected_accounting_violations"], "the lies were clamped and counted"


def test_with_the_patches_nothing_is_lost_and_clients_agree_with_the_engines(patched_run):
    _proc, out = patched_run
    summary = summary_of(out)
    outcomes = summary["outcomes"]
    assert set(outcomes) <= {"ok", "cancelled", "rejected"}, outcomes
    assert outcomes.get("ok", 0) > 50 and outcomes.get("cancelled", 0) > 0 and outcomes.get("rejected", 0) > 0
    assert summary["bad_requests"]["rejected_naming_the_field"] == summary["bad_requests"]["sent"]
    inv = summary["invariants"]
    assert inv["ok"] and inv["scrapes"] >= 8 and inv["failed_scrapes"] == 0, inv
    replicas = summary["replicas"]
    assert len(replicas) == 2 and all(r["prompt_tokens"] > 0 and not r["stale"] for r in replicas.values())
    assert summary["unexpected_replica_deaths"] == []
    cs = summary["client_server"]
    assert cs["problems"] == [] and "note" not in cs, "no replica died: the cross-check is exact"
    assert cs["engine_completed"] >= cs["client_ok"] > 0


def test_the_patched_run_wrote_its_report(patched_run):
    _proc, out = patched_run
    summary = summary_of(out)
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == summary["started"], "one line per request started"
    assert {json.loads(line)["outcome"] for line in lines} == set(summary["outcomes"])
    report = (out / "report.md").read_text()
    assert "**PASSED**" in report and "| ttft |" in report and "## Planned faults" in report
    for img in ("latency_cdf.png", "counters.png", "throughput.png"):
        assert (out / img).stat().st_size > 1000 and f"({img})" in report
    assert (out / "metrics.jsonl").read_text().count("\n") == summary["invariants"]["scrapes"]


@pytest.mark.long  # docs/development.md, the long tests (its twins at the engine and in the CLI run by default)
def test_with_stock_accounting_it_fails_and_names_what_broke(stock_run):
    """Stock accounting under the same lies: seen here, both EngineCores die within ~20 s (asserts in the
    scheduler: ``num_computed_tokens <= request.num_tokens`` for a count beyond the prompt; in the offloading
    connector's store jobs for a negative one) and every later request fails. The report must say so: the
    engine death, on which replicas, and the errors it caused; or, should stock vLLM survive some day, the
    invariant that broke."""
    proc, out = stock_run
    assert proc.returncode == 1, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    summary = summary_of(out)
    assert not summary["passed"] and summary["patches_off"] == "accounting"
    failures = summary["failures"]
    deaths = [f for f in failures if "died without the run killing them" in f]
    broken = [f for f in failures if "invariant violation(s)" in f]
    assert deaths or broken, failures
    if deaths:
        assert summary["unexpected_replica_deaths"] and all(
            r in deaths[0] for r in summary["unexpected_replica_deaths"]
        )
        assert any("unexpected error" in f and "EngineCore" in f for f in failures), failures
    report = (out / "report.md").read_text()
    assert "**FAILED**" in report and (deaths or broken)[0] in report
