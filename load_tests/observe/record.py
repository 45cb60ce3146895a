"""Record what the nodes exported during a run, cut to the families the shipped Prometheus rules read, so the
rules can be replayed through promtool on a real run's series (``python -m load_tests ... --record-metrics F``;
``testkit.monitoring.record`` turns the file into promtool input series).

One JSON line per endpoint and recording: ``{"t": seconds since the run's t0,
"url": endpoint, "text": exposition text}``, at most every ``every_s`` per
endpoint (Prometheus' own scrape interval is 10-15 s; the monitor scrapes
every 2 s). An endpoint that could not be read is recorded as ``"error"``:
Prometheus would mark its series stale, and the replay does the same.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# What is kept: every counter and gauge of vLLM, of Serve's deployments and health checks, and of the guard;
# not histograms (a bucket line per boundary, and no rule reads them). tests/test_operations.py checks that
# every family monitoring/'s rules name passes this filter (this package may not import monitoring).
KEPT_PREFIXES = ("ray_vllm_", "ray_serve_deployment_", "ray_serve_health_check_failures", "ray_fuzzserve_")
_HISTOGRAM_LINE = re.compile(r"^[a-z_:0-9]+_(bucket|sum|count)[{ ]")


def kept(line: str) -> bool:
    """Whether a line of exposition text is recorded (comments of kept families included)."""
    if line.startswith("# "):
        parts = line.split(" ", 3)
        name = parts[2] if len(parts) > 2 else ""
        return name.startswith(KEPT_PREFIXES) and not (len(parts) > 3 and parts[3].startswith("histogram"))
    return line.startswith(KEPT_PREFIXES) and not _HISTOGRAM_LINE.match(line)


class MetricsRecorder:
    """Append each endpoint's page to ``path`` at most every ``every_s`` seconds (called from the monitor's
    scrapes, off the event loop)."""

    def __init__(self, path: Path, every_s: float = 10.0):
        self.path, self.every_s = Path(path), every_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self._last: dict[str, float] = {}

    def __call__(self, t: float, pages: list[tuple[str, str | BaseException]]) -> None:
        lines = []
        for url, page in pages:
            if t - self._last.get(url, float("-inf")) < self.every_s:
                continue
            self._last[url] = t
            if isinstance(page, BaseException):
                lines.append({"t": round(t, 2), "url": url, "error": f"{type(page).__name__}: {page}"[:200]})
            else:
                text = "".join(ln + "\n" for ln in page.splitlines() if kept(ln))
                lines.append({"t": round(t, 2), "url": url, "text": text})
        if lines:
            with self.path.open("a") as f:
                f.writelines(json.dumps(x) + "\n" for x in lines)
