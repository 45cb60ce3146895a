"""Where the Prometheus tools (promtool, the Prometheus server) are, for the monitoring tests and the e2e run.

They come from Debian's ``prometheus`` package, unpacked into
``.cache/tools/`` by ``scripts/install_promtool.sh`` (which the project's
bootstrap runs). ``FUZZSERVE_PROMTOOL`` / ``FUZZSERVE_PROMETHEUS`` point at
other binaries; a tool on PATH is the last resort.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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
