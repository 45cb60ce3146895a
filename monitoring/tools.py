"""Where the monitoring files and the Prometheus tools are.

promtool and the Prometheus server come from Debian's ``prometheus`` package,
unpacked into ``.cache/tools/`` by ``scripts/install_promtool.sh`` (which the
project's bootstrap runs). ``FUZZSERVE_PROMTOOL`` / ``FUZZSERVE_PROMETHEUS``
point at other binaries; a tool on PATH is the last resort.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MONITORING_DIR = Path(__file__).resolve().parent
PROMETHEUS_DIR = MONITORING_DIR / "prometheus"
RULES_FILE = PROMETHEUS_DIR / "fuzzserve-rules.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD_FILE = MONITORING_DIR / "grafana" / "fuzzserve-dashboard.json"
TOOLS_BIN = REPO / ".cache" / "tools" / "bin"
INSTALL_HINT = "scripts/install_promtool.sh installs it (the bootstrap runs it)"


class ToolMissing(RuntimeError):
    pass


def tool(name: str) -> Path:
    """The path of ``promtool`` or ``prometheus``; :class:`ToolMissing` (never a skip) when it is not installed."""
    override = os.environ.get(f"FUZZSERVE_{name.upper()}")
    candidates = [override] if override else [TOOLS_BIN / name, shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    where = f"FUZZSERVE_{name.upper()}={override}" if override else f"{TOOLS_BIN} or on PATH"
    raise ToolMissing(f"{name} not found ({where}): {INSTALL_HINT}")
