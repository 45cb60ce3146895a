"""The benchmark client's scheduling (benchmarks.harness.client_priority) and vs_vllm's check that the client ran
with what it was asked: the kernel's word against the module's, the refusal path, and a client that lies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.harness import client_priority
from benchmarks.harness.arms import ProtocolError
from benchmarks.harness.phase import run_client
from benchmarks.harness.vllm_bench_serve import SCHED_LINE

REPO = Path(__file__).resolve().parents[1]


def in_fresh_process(code: str) -> str:
    """Run ``code`` in a new interpreter (scheduling is per thread: pytest's own stays as it is)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, check=True
    )
    return out.stdout.strip()


def test_fifo_says_what_the_kernel_does():
    """Whatever this host allows, what apply() returns matches the policy the kernel reports for the thread."""
    said, kernel_fifo = in_fresh_process(
        """
        import os
        from benchmarks.harness import client_priority
        said = client_priority.apply("fifo")
        print(said + "|" + str(os.sched_getscheduler(0) == os.SCHED_FIFO))
        """
    ).split("|")
    assert (said == client_priority.apply_result("fifo")) == (kernel_fifo == "True"), said


def test_from_env_applies_the_variable_and_normal_leaves_the_thread_alone():
    got = in_fresh_process(
        f"""
        import os
        from benchmarks.harness import client_priority
        before = os.sched_getscheduler(0)
        print(client_priority.from_env({{}}), os.sched_getscheduler(0) == before)
        print(client_priority.from_env({{"{client_priority.ENV}": "fifo"}}))
        """
    ).splitlines()
    assert got[0] == "normal True"
    assert got[1] == client_priority.apply_result("fifo") or got[1].startswith("normal (SCHED_FIFO refused")


def test_an_unknown_policy_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=client_priority.ENV):
        client_priority.apply("realtime")


def test_a_refused_fifo_falls_back_to_normal_and_says_why(monkeypatch):
    def refuse(*_args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    said = client_priority.apply("fifo")
    assert said.startswith("normal (SCHED_FIFO refused") and "not permitted" in said
    policy, why = client_priority.choose("fifo")
    assert policy == "normal" and why == said
    assert client_priority.choose("normal") == ("normal", None)


def fake_client(tmp_path: Path, reports: str) -> tuple[list[str], Path]:
    """A stand-in for vLLM's bench (only what run_client reads): it reports ``reports`` as its scheduling."""
    result = tmp_path / "result.json"
    script = tmp_path / "client.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json
            print("INFO x: {SCHED_LINE} {reports}")
            print("Starting main benchmark run...")
            print("============ Serving Benchmark Result ============", flush=True)
            open({str(result)!r}, "w").write(json.dumps({{"completed": 1}}))
            """
        )
    )
    return [sys.executable, str(script)], result


def test_run_client_takes_a_client_that_ran_as_asked(tmp_path):
    argv, result = fake_client(tmp_path, "normal")
    data, _, _ = run_client(argv, result, "normal")
    assert data == {"completed": 1}
    assert json.loads(result.read_text()) == data


def test_run_client_refuses_a_client_that_ran_otherwise(tmp_path):
    """The negative control: asked for fifo, the client says normal: the run does not count."""
    argv, result = fake_client(tmp_path, "normal (SCHED_FIFO refused: [Errno 1])")
    with pytest.raises(ProtocolError, match="fifo"):
        run_client(argv, result, "fifo")
