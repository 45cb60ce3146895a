"""A load run's recorded metrics (``python -m load_tests ... --record-metrics F``) as promtool input series, to
replay the shipped alert rules on what a real redeploy, scale or node loss exported.

    python -m testkit.monitoring.record out/redeploy/metrics.jsonl redeploy   # -> tests/fixtures/monitoring/operations/

The recording holds, per endpoint, its text every ~10 s (``load_tests.observe.record``).
Each recording goes into the promtool step nearest its time; a step an
endpoint was not read in is a missing sample (``_``), and the first failed read
of an endpoint ends its series with a staleness marker, as Prometheus does
when a target goes away. After the run every series still exported at the end
keeps its last value for ``after_s`` (Ray keeps exporting a stopped replica's
counters and Serve's last gauge for it: ray issue #65892), so the rules are
also judged on the half hour after the operation.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from load_tests.observe.prom_text import parse_samples

from .fixtures import FIXTURE_DIR, SCRAPE_JOB, series_selector
from .promtool import _expected, alerting_rules, rule_test_file

OPERATIONS_DIR = FIXTURE_DIR / "operations"
STEP_S = 10


def read(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def input_series(
    records: list[dict[str, Any]], step_s: int = STEP_S, after_s: float = 40 * 60
) -> tuple[dict[str, str], int]:
    """promtool ``input_series`` (selector -> values) of a recording, and how many steps the run covers."""
    t_first = min(r["t"] for r in records)
    steps = max(round((r["t"] - t_first) / step_s) for r in records) + 1
    values: dict[str, list[str]] = {}
    owner: dict[str, str] = {}  # series -> endpoint
    last_read: dict[str, int] = {}  # endpoint -> last step it was read in
    failed_last: set[str] = set()  # endpoints whose last recording is a failed read: their series end
    for r in sorted(records, key=lambda r: r["t"]):
        step = round((r["t"] - t_first) / step_s)
        url = r["url"]
        if "error" in r:
            failed_last.add(url)
            for sel, vals in values.items():  # the target went away: its series end (once)
                if owner[sel] == url and vals[step] == "_" and not any(v == "stale" for v in vals[:step]):
                    vals[step] = "stale"
            continue
        last_read[url] = step
        failed_last.discard(url)
        instance = urlparse(url).netloc
        for (name, labels), v in parse_samples(r["text"]).items():
            kept = {k: val for k, val in labels if val != ""}
            sel = series_selector(name, {**kept, "instance": instance, "job": SCRAPE_JOB})
            vals = values.setdefault(sel, ["_"] * steps)
            owner[sel] = url
            vals[step] = f"{v:.17g}"
    out = {}
    extra = int(after_s // step_s)
    for sel, vals in values.items():
        end = None if owner[sel] in failed_last else last_read.get(owner[sel])
        tail = vals[end] if end is not None and vals[end] not in ("_", "stale") else None
        out[sel] = " ".join(_runs(vals)) + (f" {tail}x{extra}" if tail is not None and extra else "")
    return out, steps


def _runs(vals: list[str]) -> list[str]:
    """Runs of one value written as promtool's ``vxN`` (N more repeats) or ``_xN`` (N missing)."""
    out, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[i] and vals[i] != "stale":
            j += 1
        n = j - i
        out.append(vals[i] if n == 0 else (f"_x{n + 1}" if vals[i] == "_" else f"{vals[i]}x{n}"))
        i = j + 1
    return out


def main(argv: list[str] | None = None) -> int:
    """Save a run's recording, gzipped, as the fixture ``operations/<name>.jsonl.gz``."""
    src, name = (argv if argv is not None else sys.argv[1:])[:2]
    OPERATIONS_DIR.mkdir(parents=True, exist_ok=True)
    dest = OPERATIONS_DIR / f"{name}.jsonl.gz"
    with open(src, "rb") as f, gzip.open(dest, "wb", compresslevel=9) as g:
        g.write(f.read())
    print(dest, dest.stat().st_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def replay_test(
    series: dict[str, str],
    checks: list[tuple[str, str, list]],
    rules_file: Path | None = None,
    interval: str = f"{STEP_S}s",
) -> dict[str, Any]:
    """A promtool unit-test document over one recording: ``checks`` are (alertname, eval_time, firings) with
    :class:`~testkit.monitoring.promtool.Firing` firings (an empty list: silent)."""
    doc = rule_test_file([], **({"rules_file": rules_file} if rules_file else {}))
    rules = alerting_rules(rules_file) if rules_file else alerting_rules()
    doc["tests"] = [
        {
            "name": "recorded run",
            "interval": interval,
            "input_series": [{"series": s, "values": v} for s, v in series.items()],
            "alert_rule_test": [
                {"alertname": a, "eval_time": t, "exp_alerts": [_expected(rules[a], f) for f in firings]}
                for a, t, firings in checks
            ],
        }
    ]
    return doc
