"""benchmarks/harness/stopping.py: a SIGTERM unwinds a benchmark like Ctrl-C, through its ``finally`` blocks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# a stand-in for a benchmark: a finally block that stops what it started, and a TERM from outside while it runs
SCRIPT = """
import os, signal, sys, time
{setup}
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
finally:
    print("stopped what it started", flush=True)
"""


def _run(setup: str) -> subprocess.CompletedProcess:
    code = SCRIPT.format(setup=setup)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)


def test_a_term_runs_the_finally_blocks_once_stop_on_term_is_set():
    done = _run("from benchmarks.harness.stopping import stop_on_term; stop_on_term()")
    assert "stopped what it started" in done.stdout, (done.returncode, done.stderr)
    assert "KeyboardInterrupt" in done.stderr


def test_without_it_a_term_skips_them():
    # the control: Python's default for SIGTERM ends the process at once, cleanup skipped
    done = _run("")
    assert done.returncode == -15 and "stopped what it started" not in done.stdout, (done.returncode, done.stdout)
