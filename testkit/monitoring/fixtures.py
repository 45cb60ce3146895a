"""The test fixtures: what a real deployment exported, trimmed to the families the rules and the dashboard use.

    python -m testkit.monitoring.fixtures out/monitoring-capture   # capture dir -> tests/fixtures/monitoring/

``python -m testkit.monitoring.capture`` saves the full text of every node's metrics
endpoint (over a megabyte each: every histogram of Ray itself). The tests
need only the families that ``monitoring/prometheus/fuzzserve-rules.yml`` and
the dashboard name, with their labels exactly as exported, so this keeps
those (comments included) and drops the rest. :func:`fixture_samples` reads
them back as Prometheus would store them after a scrape (``instance`` and
``job`` added).
"""

from __future__ import annotations

import sys
from pathlib import Path

from load_tests.observe.prom_text import Labels, parse_samples
from monitoring.families import HISTOGRAM_SUFFIXES, referenced_families, trim

from .tools import REPO

FIXTURE_DIR = REPO / "tests" / "fixtures" / "monitoring"
SCRAPE_JOB = "ray"


def fixture_samples(directory: Path = FIXTURE_DIR) -> dict[tuple[str, Labels], float]:
    """Every sample of every node file, labelled as Prometheus stores a scrape of that node: ``instance`` and
    ``job`` added, labels with an empty value dropped (Prometheus treats them as absent)."""
    out: dict[tuple[str, Labels], float] = {}
    for i, path in enumerate(sorted(directory.glob("node*.prom"))):
        instance = f"127.0.0.1:{8089 + i}"
        for (name, labels), value in parse_samples(path.read_text()).items():
            kept = {k: v for k, v in labels if v != ""}
            out[(name, tuple(sorted({**kept, "instance": instance, "job": SCRAPE_JOB}.items())))] = value
    return out


def ramped_series(samples: dict[tuple[str, Labels], float], steps: int = 40) -> dict[str, str]:
    """promtool input series from one scrape: cumulative samples (counters, histogram buckets, sums and counts)
    grow by 5 % of their value per step, so every rate() sees traffic and buckets stay ordered; gauges stay."""
    out = {}
    for (name, labels), v in samples.items():
        cumulative = name.endswith(("_total", *HISTOGRAM_SUFFIXES))
        out[series_selector(name, labels)] = f"{v:g}+{v / 20:g}x{steps}" if cumulative else f"{v:g}x{steps}"
    return out


def series_selector(name: str, labels: dict[str, str] | Labels) -> str:
    """``name{k="v",...}`` as promtool's unit tests and PromQL write a series."""
    items = sorted(dict(labels).items())
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return f"{name}{{{body}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def main(argv: list[str] | None = None) -> int:
    src = Path((argv if argv is not None else sys.argv[1:])[0])
    FIXTURE_DIR.mkdir(parents=True, exist_ok=True)
    families = referenced_families()
    for path in sorted(src.glob("node*.prom")):
        (FIXTURE_DIR / path.name).write_text(trim(path.read_text(), families))
    sd = src / "prom_metrics_service_discovery.json"
    if sd.exists():
        (FIXTURE_DIR / sd.name).write_text(sd.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
