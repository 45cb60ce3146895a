"""How the project's commands log to the terminal: their own progress and results, not the libraries' log lines.

Every command's own loggers are ``fuzzserve.*``: they print at INFO. Every
other logger (Ray, vLLM, httpx, transformers, ...) prints only from WARNING
up, so errors stay visible and a run's console reads as what the command is
doing. :func:`command_logging` is the one set-up every command calls first
thing in ``main``; ``fixture_model`` (which imports no other package of the
project) does the same in its own two lines.
"""

from __future__ import annotations

import logging

OWN = "fuzzserve"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def command_logging(own_level: int = logging.INFO) -> None:
    """The terminal gets the ``fuzzserve.*`` loggers at ``own_level`` and every library's from WARNING up."""
    logging.basicConfig(level=logging.WARNING, format=FORMAT)
    logging.getLogger(OWN).setLevel(own_level)
