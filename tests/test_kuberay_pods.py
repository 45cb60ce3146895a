"""The CPU RayService's pods, emulated on this host (testkit/kuberay_pods.py: a network namespace per pod, the
manifest's environment and ``ray start`` parameters, the deploy as KubeRay's operator makes it, the manifest's
probes run literally), serving a keyed fuzz request on every pod and passing the load-test CLI's smoke run.

Long (about 5 minutes, two engines and three Ray nodes; root): the default run checks the manifests offline
(tests/test_kuberay.py); this adds that what they start works. Run by hand, logged in the results log.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from serve_app.config import kuberay as k
from testkit.kuberay_pods import emulate

pytestmark = [pytest.mark.long, pytest.mark.engine, pytest.mark.serve]


def test_the_cpu_manifests_pods_deploy_probe_serve_and_pass_a_smoke_load(tmp_path):
    assert os.geteuid() == 0, "the emulation needs root (network namespaces, a bridge, mounts)"
    found = emulate(k.TARGETS["cpu"].manifest, tmp_path, load_test="smoke")
    workers = [p for p in found["pods"] if p != "head"]
    # before the deploy a worker's readiness fails (no Serve yet); node health passes everywhere
    assert all(found["probes_before_deploy"][p]["livenessProbe"] for p in found["pods"])
    assert not any(found["probes_before_deploy"][w]["readinessProbe"] for w in workers)
    assert all(all(v.values()) for v in found["probes_after_deploy"].values()), found["probes_after_deploy"]
    assert found["replicas_by_pod"] == {"head": 0, **dict.fromkeys(workers, 1)}
    for pod, got in found["requests"].items():
        assert (got["keyed"], got["unkeyed"]) == (200, 401), (pod, got)
    assert all(found["metrics"][w] for w in workers), found["metrics"]
    assert found["load_test"]["exit_code"] == 0, Path(tmp_path / "load_test.log").read_text()[-3000:]
    summary = json.loads(Path(found["load_test"]["summary"]).read_text())
    assert summary["passed"] is True
