"""End to end through Serve: a redeploy under load run by the CLI (``--scenario redeploy-lite``); a long test.

``python -m load_tests --scenario redeploy-lite`` starts a local Ray cluster,
deploys serve_config.yaml with 2 engine replicas, drives 16 concurrent
requests of the full mix, and 15 s in ``serve deploy``s the app with a
changed engine setting (Serve replaces every replica, one at a time) and a
newly allowed ``vllm_xargs`` key; the load runs until the new replicas serve,
plus 15 s. It runs with ``--no-ingress-retry``, as a client that does not
send a 503 again (curl, vLLM's ``bench serve``) would: a refusal at the
ingress (HAProxy's 503 before any replica sees the request) is then a 5xx
and fails the run (issue 34; the lever: serve_app/engine/direct_server.py,
``ROUTER_LINGER_S``). The run must pass: nothing lost, no 5xx, both old
replicas retired (not dead), the probe refused before and accepted after. The
scenarios at 256 streams (redeploy, scale, node-loss) and the failing twins
are run by hand: docs/load_tests.md, Operations.

It carries the ``long`` marker (``scripts/test.sh -m long``; docs/development.md,
the long tests): by default its checks are made on the session's cluster
(``tests/test_serve_app.py``: the streams a redeploy drains and the requests
sent during its rollout, none refused) and the CLI's judging of a redeploy on
the echo server (``tests/test_load_cli.py``); this run adds the CLI's own
cluster and ``serve deploy`` under its full mix, ~10 minutes on 2 cores.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.serve, pytest.mark.long]


@pytest.fixture(scope="module")
def redeploy_run(fixture_model, tmp_path_factory):
    from load_tests.operate.ports import free_port

    out = tmp_path_factory.mktemp("redeploy-lite")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "load_tests",
            "--scenario",
            "redeploy-lite",
            "--out",
            str(out),
            "--http-port",
            str(free_port()),
            "--no-progress",
            "--no-sweep",
            "--no-ingress-retry",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return proc, json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else None


def test_a_redeploy_under_load_loses_nothing_and_retires_the_old_replicas(redeploy_run):
    proc, summary = redeploy_run
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-8000:]}"
    assert summary["passed"] and summary["failures"] == []
    assert set(summary["outcomes"]) <= {"ok", "cancelled", "rejected"}, summary["outcomes"]
    assert summary["ingress_retries"]["requests"] == 0, summary["ingress_retries"]
    assert summary["unexpected_replica_deaths"] == []
    (check,) = summary["planned_faults"]
    assert check["fault"] == "redeploy" and check["ok"], check
    (detail,) = summary["faults"]
    assert detail["kind"] == "redeploy" and detail["converged"] and len(detail["replicas_after"]) == 2
    assert not set(detail["replicas_after"]) & set(detail["replicas_before"]), "every replica was replaced"
    assert set(check["per_replica"]["departures"]) >= set(detail["replicas_before"]), "the old ones retired"
    assert summary["invariants"]["ok"]


def test_the_probe_saw_the_guard_change_only_after_the_rollout(redeploy_run):
    _proc, summary = redeploy_run
    (fault,) = summary["faults"]
    probes = fault["probes"]
    before = [p for p in probes if p["answered"] < fault["t"]]
    after = [p for p in probes if p["t"] >= fault["converged_t"]]
    assert before and all(p["status"] == 400 and p["names_key"] for p in before), before
    assert after and all(p["status"] == 200 for p in after), after
