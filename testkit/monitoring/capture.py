"""Capture what a real deployment exports, as fixtures for the rule and dashboard tests.

    python -m testkit.monitoring.capture [--out out/monitoring-capture] [--duration 60]

Deploys serve_config.yaml under the chaos scenario's engine settings (patches
on, so the accounting patch's violation and correction counters exist), drives
the smoke request mix at it, waits for Ray's metrics agents to export, then
saves the text of every node's metrics endpoint and Ray's service-discovery
file to ``--out``. ``python -m testkit.monitoring.fixtures`` trims those to the
families the rules and the dashboard use (tests/fixtures/monitoring/).
Starts a Ray cluster and engines: run it under the heavy-job lock.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

import httpx

from load_tests.command_logs import command_logging
from load_tests.observe.scraper import DISCOVERY_NAME, discovery_file

from .chaos_deployment import chaos_scenario, deploy, smoke_load

log = logging.getLogger("fuzzserve.monitoring")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("out/monitoring-capture"))
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--export-wait", type=float, default=20.0, help="seconds to let Ray's agents export after the load")
    args = ap.parse_args(argv)
    command_logging()
    args.out.mkdir(parents=True, exist_ok=True)
    sc = chaos_scenario(args.duration, args.concurrency, kill_at_s=None)
    cluster = deploy(sc, args.out / "deploy", patches_off=None)
    try:
        smoke_load(cluster.base_url, cluster.metrics_urls, args.out / "load", args.duration, args.concurrency)
        time.sleep(args.export_wait)
        for i, url in enumerate(cluster.metrics_urls):
            text = httpx.get(url, timeout=60).text
            (args.out / f"node{i}.prom").write_text(text)
            log.info("saved %s (%d bytes) from %s", args.out / f"node{i}.prom", len(text), url)
        shutil.copy(discovery_file(), args.out / DISCOVERY_NAME)
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
