"""Run a ``testkit`` probe (a module that prints one JSON line) in a child process of its own, so that the patches'
switches (``FUZZSERVE_PATCHES_OFF`` and the like) apply to a fresh vLLM import, and kill whatever it left."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import Any

from serve_app.engine.engine_env import ENGINE_ENV


def run_probe(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """``python -m module *args`` with the engine's environment plus ``env``; its last stdout line, parsed. A
    failed run fails with the end of its stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        env={**os.environ, **ENGINE_ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the engine's own processes, if any were left
    if proc.returncode != 0:
        raise AssertionError(f"{module} exited {proc.returncode}:\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])
