"""The load tests' and benchmarks' console and run log: :func:`command_logging` (the terminal rule every command of
the project follows, :mod:`serve_app.command_logs`) and :func:`log_to_file`, the run's log file that takes what the
terminal leaves out."""

from __future__ import annotations

import logging
from pathlib import Path

from serve_app.command_logs import FORMAT, OWN, command_logging

__all__ = ["FORMAT", "command_logging", "log_to_file"]


class _ConsoleRule(logging.Filter):
    """What the terminal shows once a run log takes the rest: the ``fuzzserve.*`` records at their logger's level,
    every other logger's from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name == OWN or record.name.startswith(OWN + ".")


def log_to_file(path: Path) -> Path:
    """Every logger's records from INFO up also go to ``path`` (the run's log: a library's INFO, such as each HTTP
    request its client made, is there and not on the terminal, which keeps :func:`command_logging`'s rule)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in root.handlers:
        handler.addFilter(_ConsoleRule())
    file_handler = logging.FileHandler(path, encoding="utf-8")
    file_handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(file_handler)
    root.setLevel(logging.INFO)
    return path
