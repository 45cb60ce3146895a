"""The shipped alert rules replayed through promtool on what real runs exported while the deployment changed.

The recordings (tests/fixtures/monitoring/operations/, from ``python -m
load_tests --scenario redeploy|scale|autoscale|node-loss --record-metrics F``, saved
with ``python -m testkit.monitoring.record F NAME``) hold every node's export
of the rules' families every ~10 s of a run at 256 streams. Replayed, with the
half hour after the run (a stopped replica's series keep their last values),
every alert is evaluated each minute:

* a clean redeploy, a scale 2 -> 4 -> 1 -> 2 and Serve's autoscaler going 1 -> 2 -> 1: every alert stays silent
  (a retired replica's frozen series are not a decrease, a death or a stale
  replica);
* a node loss: only ``FuzzserveReplicaDied`` fires, for the replicas lost with
  the node, and it resolves half an hour later.

And the replay can fail: ``FuzzserveReplicaSeriesStale`` as it was before the
health-check gate fires on the recorded redeploy.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
import yaml

from monitoring.files import RULES_FILE
from serve_app.observability.contract import HEALTH_CHECK_FAILURES
from testkit.monitoring.promtool import Firing, alerting_rules, promtool
from testkit.monitoring.record import OPERATIONS_DIR, STEP_S, input_series, read, replay_test

AFTER_S = 35 * 60  # the replay's half hour after the run, and a little more
EVERY_S = 60
FAILURES = HEALTH_CHECK_FAILURES


def recording(name: str) -> tuple[dict[str, str], int, list[dict]]:
    records = read(OPERATIONS_DIR / f"{name}.jsonl.gz")
    series, steps = input_series(records, after_s=AFTER_S + 5 * 60)
    return series, steps, records


def replay(series: dict[str, str], checks, rules_file: Path = RULES_FILE):
    with tempfile.TemporaryDirectory(prefix="fuzzserve-replay-") as d:
        path = Path(d) / "replay_test.yml"
        path.write_text(yaml.safe_dump(replay_test(series, checks, rules_file), sort_keys=False))
        return promtool("test", "rules", str(path), timeout=600)


def silent_checks(steps: int, rules_file: Path = RULES_FILE, skip: tuple[str, ...] = ()) -> list:
    end = steps * STEP_S + AFTER_S
    return [
        (a, f"{t}s", []) for a in sorted(alerting_rules(rules_file)) if a not in skip for t in range(0, end, EVERY_S)
    ]


@pytest.mark.parametrize("name, replicas", [("redeploy", 4), ("scale", 5), ("autoscale", 2)])
def test_every_alert_stays_silent_through_a_clean_operation(name, replicas):
    series, steps, _records = recording(name)
    assert not any(s.startswith(FAILURES) for s in series), "a clean operation fails no health check"
    seen = {m for s in series for m in re.findall(r'ReplicaId="(\w+)"', s)}
    assert len(seen) >= replicas, f"the recording holds every replica the run had, retired ones too: {seen}"
    r = replay(series, silent_checks(steps))
    assert r.ok, r.output[-6000:]


def test_a_node_loss_raises_replica_died_for_the_lost_replicas_only():
    series, steps, records = recording("node_loss")
    t_first = min(r["t"] for r in records)
    loss_s = min(r["t"] for r in records if "error" in r) - t_first
    # the replicas that failed health checks: the engine replica on the lost node, and whatever else Serve had
    # placed there (the ingress request router's replica, in the recorded run)
    died = sorted(
        {
            (lab["deployment"], lab["replica"])
            for lab in (dict(re.findall(r'(\w+)="([^"]*)"', s)) for s in series if s.startswith(FAILURES))
        }
    )
    assert "LLMServer:fixture" in {d for d, _r in died}, f"the engine replica lost with the node: {died}"
    rule = "FuzzserveReplicaDied"
    firing = [
        Firing(
            {"application": "fuzzserve", "deployment": d, "replica": r},
            f"replica {r} of fuzzserve/{d} failed Serve's health checks and is not healthy",
        )
        for d, r in died
    ]
    checks = silent_checks(steps, skip=(rule,))
    checks += [(rule, f"{t}s", []) for t in range(0, int(loss_s), EVERY_S)]
    checks += [
        (rule, f"{int(loss_s) + 5 * 60}s", firing),
        (rule, f"{int(loss_s) + 20 * 60}s", firing),
        (rule, f"{int(loss_s) + 33 * 60}s", []),
    ]
    r = replay(series, checks)
    assert r.ok, r.output[-6000:]


def test_the_stale_rule_without_its_health_check_gate_cries_wolf_on_the_recorded_redeploy(tmp_path):
    text = RULES_FILE.read_text()
    gate = re.search(
        r"\n *and on \(ReplicaId\)\n *label_replace\(max by \(replica\) \(ray_serve_health_check_failures_"
        r"total\) > 0, \"ReplicaId\", \"\$1\", \"replica\", \"\(\.\+\)\"\)",
        text,
    )
    assert gate, "the gate is in the shipped rule"
    unfixed = tmp_path / "rules.yml"
    unfixed.write_text(text.replace(gate.group(0), ""))
    series, steps, _records = recording("redeploy")
    r = replay(series, silent_checks(steps, unfixed), unfixed)
    assert not r.ok and "FuzzserveReplicaSeriesStale" in r.output, r.output[-3000:]
