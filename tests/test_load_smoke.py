"""End to end: the stress-test CLI's smoke scenario against a real deployment it starts itself.

`python -m load_tests --scenario smoke` starts a local Ray cluster, deploys
serve_config.yaml (with the smoke scenario's small KV pool), drives the full
request mix while scraping every replica's counters, checks every
invariant, writes the report, tears down. The test reads what it wrote.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def smoke_run(fixture_model, tmp_path_factory):
    from serve_app.ports import free_port

    out = tmp_path_factory.mktemp("smoke")
    proc = subprocess.run([sys.executable, "-m", "load_tests", "--scenario", "smoke", "--out", str(out),
                           "--http-port", str(free_port()), "--no-progress"],
                          capture_output=True, text=True, timeout=1500)
    return proc, out


def test_smoke_run_passes_and_says_why(smoke_run):
    proc, out = smoke_run
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["passed"] and summary["failures"] == []
    outcomes = summary["outcomes"]
    assert outcomes.get("ok", 0) > 50, outcomes
    assert outcomes.get("cancelled", 0) > 0 and outcomes.get("rejected", 0) > 0, "the mix reached cancels and bad input"
    assert set(outcomes) <= {"ok", "cancelled", "rejected"}, outcomes
    assert summary["bad_requests"]["rejected_naming_the_field"] == summary["bad_requests"]["sent"]


def test_smoke_run_watched_both_replicas(smoke_run):
    _proc, out = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    inv = summary["invariants"]
    assert inv["ok"] and inv["scrapes"] >= 8 and not inv["scrape_errors"], inv
    replicas = summary["replicas"]
    assert len(replicas) == 2 and all(r["prompt_tokens"] > 0 and not r["stale"] for r in replicas.values())
    reused = sum(r["by_source"].get("local_cache_hit", 0) + r["by_source"].get("external_kv_transfer", 0)
                 for r in replicas.values())
    assert reused > 0, "shared prefixes were served from the prefix cache or the offload tier"
    cs = summary["client_server"]
    assert cs["problems"] == [] and cs["engine_completed"] >= cs["client_ok"] > 0


def test_smoke_run_wrote_its_report(smoke_run):
    _proc, out = smoke_run
    summary = json.loads((out / "summary.json").read_text())
    lines = (out / "requests.jsonl").read_text().splitlines()
    assert len(lines) == summary["started"], "one line per request started"
    assert {json.loads(line)["outcome"] for line in lines} == set(summary["outcomes"])
    report = (out / "report.md").read_text()
    assert "**PASSED**" in report and "| ttft |" in report
    for img in ("latency_cdf.png", "counters.png", "throughput.png"):
        assert (out / img).stat().st_size > 1000 and f"({img})" in report
    assert (out / "metrics.jsonl").read_text().count("\n") == summary["invariants"]["scrapes"]
