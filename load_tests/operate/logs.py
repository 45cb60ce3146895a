"""What Ray's own logs say about a run: Serve's controller force-killing a replica that did not drain."""

from __future__ import annotations

import re
from pathlib import Path

# Serve's controller log line when a replica did not drain within its graceful shutdown timeout.
FORCE_KILL_LINE = re.compile(r"did not shut down after grace period, force-killing it")


def forced_kills(session_dir: Path | None) -> list[str]:
    """Serve's controller log lines saying a replica was force-killed after its graceful shutdown timeout (a
    drain that cut requests); none without a local cluster's Ray session directory."""
    if session_dir is None:
        return []
    lines = []
    for path in sorted(Path(session_dir).glob("logs/serve/controller_*.log")):
        try:
            lines += [
                ln.strip()[:300] for ln in path.read_text(errors="replace").splitlines() if FORCE_KILL_LINE.search(ln)
            ]
        except OSError:
            continue
    return lines
