"""A command's console: its own progress and results, library lines only from WARNING up (load_tests.command_logs),
and set-up's library JSON lines kept out of the terminal (scripts/env.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from load_tests.command_logs import FORMAT
from tests.console_records import json_records

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


# A command that imports the project's Serve modules mid-run, as the load-test CLI does (serve_app.ray_internals
# imports Ray Serve LLM's serve package, whose first import sets up the process's logging).
MID_RUN = """
import logging
{setup}
import serve_app.ray_internals  # mid-run
logging.getLogger("fuzzserve.load_tests").info("load finished")
logging.getLogger("httpx").info("HTTP Request: GET /api/serve/applications/")
"""


def test_the_console_stays_plain_after_ray_serve_llm_is_imported_mid_run():
    setup = "from load_tests.command_logs import command_logging\ncommand_logging()"
    r = subprocess.run(
        [sys.executable, "-c", MID_RUN.format(setup=setup)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert json_records(r.stderr) == [], r.stderr
    assert "load finished" in r.stderr and "HTTP Request" not in r.stderr
    # the control: the same with a plain set-up before the import gets Ray's JSON records, the library's INFO included
    plain = f"logging.basicConfig(level=logging.WARNING, format={FORMAT!r})"
    r = subprocess.run(
        [sys.executable, "-c", MID_RUN.format(setup=plain)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert any("HTTP Request" in line for line in json_records(r.stderr)), r.stderr


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


def test_a_run_log_takes_every_library_record_the_console_leaves_out(tmp_path):
    log = tmp_path / "out" / "run.log"
    setup = (
        "from pathlib import Path\nfrom load_tests.command_logs import command_logging, log_to_file\n"
        f"command_logging()\nlog_to_file(Path({str(log)!r}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", MID_RUN.format(setup=setup)], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert r.returncode == 0, r.stderr
    assert "load finished" in r.stderr and "HTTP Request" not in r.stderr and json_records(r.stderr) == []
    text = log.read_text()
    assert "INFO httpx: HTTP Request: GET" in text and "INFO fuzzserve.load_tests: load finished" in text
