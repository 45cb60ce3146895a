"""A local deployment under the chaos scenario's engine settings, for the monitoring fixtures and the end-to-end run.

Both need what a real deployment exports (series names, labels, Ray's
service-discovery file) and the chaos scenario's faults, so that the
accounting patch's violation and correction counters exist. The deploy itself
is the load tests' (:func:`load_tests.operate.deploy.deploy`): same config, same
engine overrides, same ``FUZZSERVE_PATCHES_OFF`` plumbing.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("fuzzserve.monitoring")


def chaos_scenario(duration_s: float, concurrency: int, kill_at_s: float | None):
    """The chaos scenario with a shorter load (the faults and the KV pool unchanged)."""
    from load_tests.plan.scenarios import SCENARIOS

    sc = SCENARIOS["chaos"]
    profile = type(sc.profile).model_validate(
        {**sc.profile.model_dump(), "duration_s": duration_s, "concurrency": concurrency}
    )
    return sc.model_copy(update={"profile": profile, "kill_replica_at_s": kill_at_s})


def deploy(sc, out: Path, patches_off: str | None):
    """Start a local cluster and deploy serve_config.yaml with ``sc``'s engine settings (the CLI's own deploy)."""
    from rich.console import Console

    from load_tests.operate.deploy import DeploySettings
    from load_tests.operate.deploy import deploy as load_test_deploy

    return load_test_deploy(sc, DeploySettings(patches_off=patches_off), out, Console(stderr=True))


def smoke_load(base_url: str, metrics_urls: list[str], out: Path, duration_s: float, concurrency: int) -> int:
    """Drive the smoke mix at a running deployment: the load run ``python -m load_tests`` does for these flags,
    called in this process (:func:`load_tests.runner.run.run`); its exit code."""
    from rich.console import Console

    from load_tests.cli import inputs_for
    from load_tests.runner.run import run

    argv = [
        "--url",
        base_url,
        "--scenario",
        "smoke",
        "--duration",
        str(duration_s),
        "--concurrency",
        str(concurrency),
        "--no-sweep",
        "--no-progress",
        "--out",
        str(out),
        *[a for u in metrics_urls for a in ("--metrics-url", u)],
    ]
    log.info("load: python -m load_tests %s", " ".join(argv))
    return run(*inputs_for(argv), Console(stderr=True)).exit_code
