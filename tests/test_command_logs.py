"""A command's console: its own progress and results, library lines only from WARNING up (load_tests.command_logs),
and set-up's library JSON lines kept out of the terminal (scripts/env.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import logging
from load_tests.command_logs import command_logging
command_logging()
logging.getLogger("fuzzserve.load_tests").info("own progress")
logging.getLogger("vllm.triton_utils.importing").info("library note")
logging.getLogger("ray.serve").warning("library warning")
logging.getLogger("httpx").error("library error")
"""


def test_a_command_prints_its_own_progress_and_the_libraries_warnings_and_errors_only():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "own progress" in r.stderr and "library warning" in r.stderr and "library error" in r.stderr
    assert "library note" not in r.stderr


def test_set_up_keeps_library_json_lines_below_error_off_the_terminal():
    """The filter scripts/env.sh puts on set-up's stderr, fed what the bootstrap's import check prints."""
    [line] = [
        line
        for line in (REPO / "scripts" / "env.sh").read_text().splitlines()
        if "bootstrap.sh" in line and not line.lstrip().startswith("#")
    ]
    pattern = line.split("grep --line-buffered -v -E ", 1)[1].split(" >&2", 1)[0].strip("'")
    lines = [
        '{"asctime": "t", "levelname": "WARNING", "message": "Triton is installed, but ..."}',
        '{"asctime": "t", "levelname": "INFO", "message": "Triton not installed or not compatible"}',
        '{"asctime": "t", "levelname": "ERROR", "message": "a real problem"}',
        "bootstrap: ok (vllm 0.32.0, ray 2.60.0)",
    ]
    out = subprocess.run(
        ["grep", "-v", "-E", pattern], input="\n".join(lines) + "\n", capture_output=True, text=True
    ).stdout
    assert out.splitlines() == lines[2:]
