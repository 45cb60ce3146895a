"""Which exported metric families the shipped rules and dashboard read, and a page of exposition text cut down to
them: what the rule tests' fixtures keep (``testkit.monitoring.fixtures``) and what a load run records for
promtool (``load_tests.observe.record``).

A node's export is over a megabyte under Serve; the rules read a few dozen
kilobytes of it.
"""

from __future__ import annotations

import re
from pathlib import Path

from .files import DASHBOARD_FILE, RULES_FILE

_NAME = re.compile(r"\bray_[a-z0-9_]+")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def referenced_families(*files: Path) -> set[str]:
    """Every ``ray_*`` metric family named in ``files`` (default: the rules and the dashboard; histogram suffixes
    stripped)."""
    names = set()
    for f in files or (RULES_FILE, DASHBOARD_FILE):
        for name in _NAME.findall(f.read_text()):
            for suffix in HISTOGRAM_SUFFIXES:
                if name.endswith(suffix):
                    name = name[: -len(suffix)]
            names.add(name)
    return names


def family_of(line: str) -> str:
    """The family an exposition line belongs to (a ``# HELP``/``# TYPE`` line's, or a sample's without its
    histogram suffix)."""
    if line.startswith("# "):
        parts = line.split(" ", 3)
        return parts[2] if len(parts) > 2 else ""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def trim(text: str, families: set[str]) -> str:
    """The lines of ``text`` (Prometheus exposition) that belong to ``families``."""
    return "".join(line + "\n" for line in text.splitlines() if family_of(line) in families)
