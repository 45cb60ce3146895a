"""How the project's commands log to the terminal: their own progress and results, not the libraries' log lines.

Here, at the bottom of the packages that run commands (``serve_app``'s own, such as
``python -m serve_app.config.kuberay``, and every command of ``load_tests`` and
``benchmarks``, which reach it through :mod:`load_tests.command_logs`, where the
run's log file is set up too).

Every command's own loggers are ``fuzzserve.*``: they print at INFO. Every
other logger (Ray, vLLM, httpx, transformers, ...) prints only from WARNING
up, so errors stay visible and a run's console reads as what the command is
doing. :func:`command_logging` is the one set-up every command calls first
thing in ``main``; ``fixture_model`` (which imports no other package of the
project) does the same in its own two lines.

Ray Serve LLM sets up the process's logging itself, once, on the first import
of its serve package (``ray.llm._internal.serve`` runs ``setup_observability``):
it replaces the root logger's handlers with one that writes JSON records to
stderr and sets the root to INFO. A command imports that package mid-run
(``serve_app``, for the deployment's status or its config), which undid this
set-up and put a JSON record on the console for every HTTP request the command
made. So :func:`command_logging` lets Ray's set-up happen first (the import
costs about 0.9 s and pulls in neither vLLM nor torch; Ray's own ``Once``
keeps it from running again) and then puts its own in place.
"""

from __future__ import annotations

import importlib
import logging

OWN = "fuzzserve"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The package whose first import configures the root logger (ray/llm/_internal/serve/__init__.py, Ray 2.60).
RAY_LLM_SERVE = "ray.llm._internal.serve"


def command_logging(own_level: int = logging.INFO) -> None:
    """The terminal gets the ``fuzzserve.*`` loggers at ``own_level`` and every library's from WARNING up, for the
    whole run (after Ray Serve LLM's one-time set-up, not before it)."""
    importlib.import_module(RAY_LLM_SERVE)
    logging.basicConfig(level=logging.WARNING, format=FORMAT, force=True)
    logging.getLogger(OWN).setLevel(own_level)
