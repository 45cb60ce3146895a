"""The main job: a local Ray cluster, serve_config.yaml deployed, fuzz requests over HTTP, a report, teardown.

    python -m load_tests.main_job [--config serve_config.yaml] [--http-port N] [--out out/]

1. builds (or reuses) the fixture model;
2. starts a local Ray cluster (one node, ``ray start``) and ``serve deploy``s
   the config: the fuzz router in front of two patched engine replicas;
3. runs the fuzz sweep through the router over HTTP: fixture-task accuracy
   and output divergence against fuzz strength, per mode;
4. prints the per-replica prompt-token counters scraped from Ray's metrics
   export (both replicas served, the accounting identity holds);
5. shuts Serve and the cluster down, killing only what it started.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

log = logging.getLogger("fuzzserve.main_job")
console = Console()


def main(argv: list[str] | None = None) -> int:
    from serve_app.local_cluster import DEFAULT_CONFIG

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="Serve config to deploy")
    ap.add_argument("--http-port", type=int, default=None, help="override the config's HTTP port")
    ap.add_argument("--per-task", type=int, default=20, help="held-out prompts per task in the fuzz sweep")
    ap.add_argument("--out", type=Path, default=Path("out"), help="where results are written")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from fixture_model.build import ensure_model
    from fixture_model.tasks import held_out_examples
    from serve_app.local_cluster import LocalCluster

    from .fuzz_sweep import http_generator, print_table, run_sweep
    from .replica_metrics import print_table as print_counters
    from .replica_metrics import scrape

    ensure_model()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with LocalCluster(log_dir=args.out / "cluster") as cluster:
        with console.status("starting Ray and deploying (about 2 minutes on 2 cores)"):
            cluster.deploy(args.config, http_port=args.http_port)
        replicas = cluster.replicas()
        console.print(f"[bold]deployed[/] in {time.monotonic() - t0:.0f} s: router at {cluster.base_url}, "
                      f"{len(replicas)} engine replicas (pids {', '.join(str(r['pid']) for r in replicas)})")

        with console.status("fuzz sweep over HTTP through the router"):
            # if the router was given API keys (FUZZSERVE_API_KEYS), use the first
            api_key = os.environ.get("FUZZSERVE_API_KEYS", "").split(",")[0].strip() or None
            points = run_sweep(http_generator(cluster.base_url, api_key),
                               held_out_examples(args.per_task))
        print_table(points)
        (args.out / "fuzz_sweep.json").write_text(json.dumps([asdict(p) for p in points], indent=2))

        time.sleep(12)  # Ray's metrics agent exports every few seconds
        counters = scrape(cluster.metrics_urls)
        print_counters(counters)
        problems = {k: rc.sum_problems() for k, rc in counters.items() if rc.sum_problems()}
        served = [k for k, rc in counters.items() if rc.requests_total > 0]
    console.print(f"cluster stopped; total {time.monotonic() - t0:.0f} s. Results in {args.out}/")
    if problems:
        console.print(f"[red]accounting identity violated[/]: {problems}")
        return 1
    if len(served) < 2:
        console.print(f"[red]expected both replicas to serve, counters show {served}[/]")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
