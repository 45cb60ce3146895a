"""Write a run's results: per-request JSONL, summary JSON, and a Markdown report with plots.

Files in the output directory:

``requests.jsonl``   one line per request (spec, outcome, timings)
``summary.json``     the numbers and the verdict: a ``load_tests.results.models.RunSummary`` (schema:
                     docs/summary.schema.json)
``metrics.jsonl``    every monitor scrape, per replica
``report.md``        the human report, with:
``latency_cdf.png``  TTFT / TPOT / E2E CDFs
``counters.png``     prompt-token counters over time, per replica, by source
``throughput.png``   completed requests per second over time
``fuzz_sweep.png``   accuracy and divergence against fuzz strength (when a sweep ran)
``fuzz_sweep_layers.png``   accuracy by fuzz_layer x fuzz_strength, per mode (a sweep over several depths)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from ..load.client import RequestResult
from ..observe.monitor import InvariantChecker
from ..results.models import RunSummary
from .markdown import markdown
from .plots import plot_capacity, plot_counters, plot_latency_cdf, plot_sweep, plot_sweep_layers, plot_throughput

# The run's log: every logger's records from INFO up, the libraries' included (load_tests.command_logs.log_to_file);
# the console shows progress, the CLI's own records and the results.
RUN_LOG = "run.log"
# The files every report writes (a run's other outputs must not take these names).
REPORT_FILES = frozenset(
    {
        RUN_LOG,
        "requests.jsonl",
        "summary.json",
        "metrics.jsonl",
        "report.md",
        "latency_cdf.png",
        "counters.png",
        "throughput.png",
        "fuzz_sweep.png",
        "fuzz_sweep_layers.png",
        "capacity.png",
    }
)


def write_jsonl(path: Path, rows) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def write_report(
    out: Path, title: str, results: list[RequestResult], summary: RunSummary, checker: InvariantChecker, sweep=None
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "requests.jsonl", (r.to_json() for r in results))
    write_jsonl(
        out / "metrics.jsonl",
        (
            {
                "t": s.t,
                "replicas": {k: asdict(rc) for k, rc in s.replicas.items()},
                "errors": s.errors,
                "duplicates": s.duplicates,
            }
            for s in checker.history
        ),
    )
    (out / "summary.json").write_text(summary.model_dump_json(indent=2))
    images = []
    plot_latency_cdf(results, out / "latency_cdf.png")
    images.append("latency_cdf.png")
    plot_throughput(results, out / "throughput.png", summary.faults)
    if (out / "throughput.png").exists():
        images.append("throughput.png")
    plot_counters(checker, out / "counters.png", summary.faults)
    if (out / "counters.png").exists():
        images.append("counters.png")
    if summary.capacity and summary.capacity.steps:
        plot_capacity(summary.capacity, out / "capacity.png")
        images.append("capacity.png")
    if sweep:
        (out / "fuzz_sweep.json").write_text(json.dumps([asdict(p) for p in sweep], indent=2))
        plot_sweep(sweep, out / "fuzz_sweep.png")
        images.append("fuzz_sweep.png")
        if len({p.layer for p in sweep}) > 1:
            plot_sweep_layers(sweep, out / "fuzz_sweep_layers.png")
            images.append("fuzz_sweep_layers.png")
    path = out / "report.md"
    path.write_text(markdown(summary, title, sweep, images))
    return path
