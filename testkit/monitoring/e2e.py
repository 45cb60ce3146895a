"""End to end: a real Prometheus scrapes a deployment under the chaos scenario; which alerts fire.

    python -m testkit.monitoring.e2e --patches off     # stock accounting: an invariant alert must fire
    python -m testkit.monitoring.e2e --patches on      # the patches: no invariant alert may fire
    python -m testkit.monitoring.e2e                   # both, one after the other

For each run: deploy serve_config.yaml with the chaos scenario's engine
settings (KV load failures and delays, a lying connector, a KV pool small
enough for preemption; :mod:`testkit.monitoring.chaos_deployment`), start the
Prometheus server of ``scripts/install_promtool.sh`` with the project's own
scrape config and rules (``monitoring/prometheus/``: Ray's service-discovery
file as ``file_sd_configs``), drive the chaos load with the load tests'
own loop (:func:`load_tests.runner.loop.run_load`: the replica kill included), keep
the cluster up at rest long enough for the at-rest rules' windows, and record
every alert Prometheus reports (state, when it became active, value, labels)
to ``<out>/<run>/alerts.json`` and ``summary.md``.

Verdict: with patches off, at least one of :data:`JUDGED_ALERTS` (the
counter invariants, an internal accounting violation, the engine
deployment's requests failing) must fire; with patches on, none may. The
other alerts report the faults the scenario injects (a lying connector:
``FuzzserveKVConnectorReportsRejected``; the replica kill:
``FuzzserveReplicaSeriesStale``) and are recorded, not judged.
Two differences from the shipped config, both for a short run on one
machine: scrape and rule evaluation every 5 s instead of 15 s, and every
target's host rewritten to 127.0.0.1 (Ray lists the node's interface
address; the run stays on loopback).

Starts Ray clusters and engines: run it under the heavy-job lock. About 9
minutes per run on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import yaml

from load_tests.command_logs import command_logging
from load_tests.operate.ports import free_port
from monitoring.files import RULES_FILE, SCRAPE_CONFIG

from .chaos_deployment import chaos_scenario, deploy
from .tools import tool

log = logging.getLogger("fuzzserve.monitoring")

# What stock accounting under the chaos faults must raise and the patches must not: the counter invariants, an
# internal accounting violation, or (how stock vLLM actually fails on a live cluster: EngineCore dies on a bad
# connector report before a counter goes wrong) the engine deployment's requests failing.
JUDGED_ALERTS = (
    "FuzzserveCounterNegative",
    "FuzzserveCounterWentBackwards",
    "FuzzservePromptTokensDoNotSum",
    "FuzzservePromptTokensCachedExceedTotal",
    "FuzzserveAccountingViolation",
    "FuzzserveDeploymentRequestsFailing",
)


def e2e_config(rules: Path, interval_s: int) -> dict[str, Any]:
    """The shipped scrape config with a shorter interval, absolute rule paths and loopback targets."""
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    cfg["global"] = {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"}
    cfg["rule_files"] = [str(rules)]
    for job in cfg["scrape_configs"]:
        job.setdefault("relabel_configs", []).append(
            {
                "source_labels": ["__address__"],
                "regex": "[^:]+:(\\d+)",
                "replacement": "127.0.0.1:$1",
                "target_label": "__address__",
            }
        )
    return cfg


class PrometheusServer:
    """The real Prometheus server, started and stopped by pid, data and log under ``workdir``."""

    def __init__(self, config: dict[str, Any], workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.proc: subprocess.Popen | None = None
        self._log: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> PrometheusServer:
        self._log = open(self.workdir / "prometheus.log", "ab")  # noqa: SIM115 -- held for the object's life, closed when it stops
        self.proc = subprocess.Popen(
            [
                str(tool("prometheus")),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited ({self.proc.returncode}); log: {self.workdir / 'prometheus.log'}"
                )
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"prometheus not ready after {timeout:.0f} s")

    def api(self, path: str, **params: Any) -> Any:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        r.raise_for_status()
        return r.json()["data"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log:
            self._log.close()


class AlertRecorder(threading.Thread):
    """Polls ``/api/v1/alerts``; keeps, per alert instance, when it was first seen pending and firing."""

    def __init__(self, prom: PrometheusServer, t0: float, interval_s: float = 5.0):
        super().__init__(daemon=True)
        self.prom, self.t0, self.interval_s = prom, t0, interval_s
        self.seen: dict[str, dict[str, Any]] = {}
        self.stop_event = threading.Event()

    def poll(self) -> None:
        try:
            alerts = self.prom.api("alerts")["alerts"]
        except (httpx.HTTPError, KeyError) as e:
            log.warning("alerts poll failed: %s", e)
            return
        now = time.monotonic() - self.t0
        for a in alerts:
            key = json.dumps(a["labels"], sort_keys=True)
            rec = self.seen.setdefault(
                key, {"alertname": a["labels"].get("alertname"), "labels": a["labels"], "active_at": a.get("activeAt")}
            )
            rec[f"first_{a['state']}_s"] = rec.get(f"first_{a['state']}_s", round(now, 1))
            rec["last_state"], rec["last_value"], rec["last_seen_s"] = a["state"], a.get("value"), round(now, 1)
            if a["state"] == "firing" and "first_firing_wall" not in rec:
                rec["first_firing_wall"] = datetime.now(UTC).isoformat(timespec="seconds")
                rec["value_when_firing"] = a.get("value")
                log.info(
                    "alert firing: %s %s = %s",
                    rec["alertname"],
                    {k: v for k, v in a["labels"].items() if k in ("ReplicaId", "kind", "counter", "deployment")},
                    a.get("value"),
                )

    def run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            self.poll()


def run_once(
    patches: str,
    out: Path,
    duration_s: float,
    concurrency: int,
    kill_at_s: float | None,
    settle_s: float,
    interval_s: int,
) -> dict[str, Any]:
    from load_tests.operate.target import LoadTarget
    from load_tests.runner.loop import RunConfig, run_load

    out.mkdir(parents=True, exist_ok=True)
    sc = chaos_scenario(duration_s, concurrency, kill_at_s)
    started = time.monotonic()
    cluster = deploy(sc, out / "cluster", patches_off="accounting" if patches == "off" else None)
    prom = PrometheusServer(e2e_config(RULES_FILE.resolve(), interval_s), out)
    recorder = None
    try:
        prom.start()
        t0 = time.monotonic()
        recorder = AlertRecorder(prom, t0)
        recorder.start()
        target = LoadTarget(cluster.base_url, cluster.metrics_urls, None, cluster)
        run = asyncio.run(run_load(target, sc, RunConfig(seed=0, progress=False), t0))
        load_end = time.monotonic() - t0
        log.info(
            "load done after %.0f s; %d requests; holding the cluster at rest for %.0f s",
            load_end,
            run.started,
            settle_s,
        )
        time.sleep(settle_s)
        recorder.poll()
        targets = prom.api("targets")["activeTargets"]
    finally:
        if recorder is not None:
            recorder.stop_event.set()
        prom.stop()
        cluster.close()
    alerts = sorted(recorder.seen.values(), key=lambda a: (a.get("first_firing_s", 1e9), a["alertname"]))
    fired = sorted({a["alertname"] for a in alerts if "first_firing_s" in a})
    judged = [a for a in fired if a in JUDGED_ALERTS]
    passed = bool(judged) if patches == "off" else not judged
    result = {
        "patches": patches,
        "passed": passed,
        "fired": fired,
        "judged_alerts_fired": judged,
        "alerts": alerts,
        "load": {
            "requests": run.started,
            "outcomes": _outcomes(run.results),
            "load_s": round(run.wall_s, 1),
            "load_end_s": round(load_end, 1),
            "faults": [f.model_dump(mode="json") for f in run.events],
            "load_test_invariant_violations": len(run.checker.violations),
        },
        "targets": [{"url": t["scrapeUrl"], "health": t["health"], "lastError": t["lastError"]} for t in targets],
        "scenario": sc.model_dump(),
        "settle_s": settle_s,
        "interval_s": interval_s,
        "took_s": round(time.monotonic() - started, 1),
    }
    (out / "alerts.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "summary.md").write_text(summary_md(result))
    return result


def _outcomes(results) -> dict[str, int]:
    return dict(Counter(r.outcome for r in results))


def summary_md(result: dict[str, Any]) -> str:
    lines = [
        f"## patches {result['patches']}: {'PASSED' if result['passed'] else 'FAILED'}",
        "",
        (
            f"{result['load']['requests']} requests over {result['load']['load_s']} s "
            f"({result['load']['outcomes']}); faults {result['load']['faults']}; "
            f"cluster held at rest {result['settle_s']:.0f} s after the load; whole run {result['took_s']:.0f} s."
        ),
        "",
        "| alert | labels | pending at (s) | firing at (s) | value when firing | last state |",
        "|---|---|---|---|---|---|",
    ]
    for a in result["alerts"]:
        labels = ", ".join(
            f"{k}={v}" for k, v in a["labels"].items() if k in ("ReplicaId", "kind", "counter", "deployment")
        )
        lines.append(
            f"| {a['alertname']} | {labels} | {a.get('first_pending_s', '-')} | "
            f"{a.get('first_firing_s', '-')} | {a.get('value_when_firing', '-')} | {a.get('last_state')} |"
        )
    lines.append("")
    lines.append("Times are seconds from the start of the load (the replica kill, if any, is in `faults`).")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patches", choices=("on", "off", "both"), default="both")
    ap.add_argument("--out", type=Path, default=Path("out/monitoring-e2e"))
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of chaos load")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--kill-at", type=float, default=60.0, help="SIGKILL one replica this far into the load")
    ap.add_argument(
        "--settle",
        type=float,
        default=240.0,
        help="seconds to keep the cluster at rest after the load (the at-rest rules need 3 minutes)",
    )
    ap.add_argument("--interval", type=int, default=5, help="scrape and rule-evaluation interval (s)")
    args = ap.parse_args(argv)
    command_logging()
    ok = True
    for patches in ("off", "on") if args.patches == "both" else (args.patches,):
        result = run_once(
            patches,
            args.out / f"patches-{patches}",
            args.duration,
            args.concurrency,
            args.kill_at,
            args.settle,
            args.interval,
        )
        print(summary_md(result))
        ok &= result["passed"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
