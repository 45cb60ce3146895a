"""The marker check (tests/markers.py) can fail: a pytest run of tests that start things without saying so.

Each case is a tiny test file run by a pytest subprocess with the check
loaded; the "engine" and "Ray cluster" it starts are bare processes that
look like them to the check (no real engine: this file is a fast test), and
the marked twin of each case must pass.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from tests.markers import classify

REPO = Path(__file__).resolve().parents[1]

CASES = textwrap.dedent("""
    import os, select, subprocess, sys
    import pytest

    READY_TIMEOUT_S = 120  # importing torch on a loaded 2-core host takes seconds; this only bounds a hang

    # The children stay alive, blocked reading their stdin, until this pytest run exits and the pipe closes:
    # so each is still there, ready, when the check takes its last look at the end of its test (its watcher
    # polls every 0.5 s and a child killed before a poll would go unseen), and a later test's watcher counts
    # it as already there (it watches only processes new to it).
    _children = []

    @pytest.fixture
    def fixture_model():
        return "unused: the check fails the test before this runs"

    def _start(argv0, *args, title=None):
        code = "import sys; print('ready', flush=True); sys.stdin.read()"
        if title:  # a process that takes an EngineCore title and has torch loaded, as vLLM's does
            code = (f"import sys, torch, setproctitle; setproctitle.setproctitle({title!r}); "
                    "print('ready', flush=True); sys.stdin.read()")
        # exec -a hides the interpreter's path: Python then finds its home (and the venv's torch) by
        # looking argv0 up on PATH, so the venv's bin goes first whichever way pytest was started.
        bin_dir = os.path.dirname(sys.executable)
        cmd = f'PATH={bin_dir}:$PATH exec -a {argv0} {sys.executable} -c "{code}" {" ".join(args)}'
        p = subprocess.Popen(["bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        _children.append(p)
        # the child's own word that it has its title and torch loaded (or, if it died, an empty read)
        readable, _, _ = select.select([p.stdout], [], [], READY_TIMEOUT_S)
        assert readable and p.stdout.readline() == "ready\\n", f"{argv0} never got ready (exit {p.poll()})"

    def test_uses_the_model_unmarked(fixture_model):
        pass

    @pytest.mark.engine
    def test_uses_the_model_marked(fixture_model):
        pass

    def test_starts_an_engine_unmarked():
        _start("python", title="VLLM::EngineCore")

    @pytest.mark.engine
    def test_starts_an_engine_marked():
        _start("python", title="VLLM::EngineCore")

    @pytest.mark.engine
    def test_starts_a_ray_node_marked_engine_only():
        _start("raylet")

    @pytest.mark.engine
    @pytest.mark.serve
    def test_starts_a_ray_node_marked():
        _start("raylet")

    def test_starts_nothing():
        _start("python")

    @pytest.mark.engine
    def test_starts_nothing_marked_engine():
        _start("python")
""")

CONFTEST = "from tests.markers import *  # noqa: F401,F403\n"


def test_the_check_fails_unmarked_tests_and_passes_their_marked_twins(tmp_path):
    (tmp_path / "test_cases.py").write_text(CASES)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-q", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    out = r.stdout
    assert r.returncode == 1, out[-3000:]
    failed = {line.split("::")[1].split()[0] for line in out.splitlines() if line.startswith(("FAILED", "ERROR"))}
    assert failed == {
        "test_uses_the_model_unmarked",
        "test_starts_an_engine_unmarked",
        "test_starts_a_ray_node_marked_engine_only",
        "test_starts_nothing_marked_engine",
    }, out[-3000:]
    assert "a pure test belongs in the fast suite" in out
    assert "uses fixture_model but is not marked engine" in out
    assert "without the 'engine' marker" in out and "without the 'serve' marker" in out
    for ok in (
        "test_uses_the_model_marked",
        "test_starts_an_engine_marked",
        "test_starts_a_ray_node_marked",
        "test_starts_nothing",
    ):
        assert f"PASSED test_cases.py::{ok}" in out, out[-3000:]


def test_what_counts_as_an_engine_or_a_cluster():
    import torch  # noqa: F401  (so that this process has libtorch loaded, as an EngineCore has)

    assert (
        classify(["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "python") == "engine"
    )
    assert (
        classify(["/venv/bin/python", "-m", "patches.matrix.engine_run", "job.json", "out.json"], "python") == "engine"
    )
    assert classify(["VLLM::EngineCore"], "VLLM::EngineCor", psutil.Process().pid) == "engine", "this process has torch"
    assert classify(["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--x"], "raylet") == "serve"
    assert classify(["/venv/bin/python", "/venv/bin/ray", "start", "--block", "--head"], "ray") == "serve"
    assert classify(["/venv/bin/python", "-m", "testkit.echo_server"], "python") is None
    assert classify(["/venv/bin/python", "-c", "...", "VLLM::EngineCore"], "python", pid=_bare_pid()) is None, (
        "a bare process that only takes the title (test_core_binding's) is not an engine"
    )


def _bare_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    import atexit

    atexit.register(p.kill)
    return p.pid
