"""Reading a command's console: which of its lines are Ray's JSON log records (a shared helper of the console tests)."""

from __future__ import annotations

import json


def json_records(text: str) -> list[str]:
    """The lines of ``text`` that are JSON objects (Ray's JSONFormatter's records)."""
    found = []
    for line in text.splitlines():
        try:
            if isinstance(json.loads(line), dict):
                found.append(line)
        except ValueError:
            pass
    return found
