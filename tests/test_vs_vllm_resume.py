"""A stopped headline run continued with ``--resume`` (benchmarks/harness/resume.py, benchmarks/vs_vllm.py).

What must hold for a resumed run's figures to mean what a single sitting's do:
only the same measurement (workload, arms, pairs, seed), machine kind and
code under test may be continued; every phase with a valid run at each label
is kept only within a pair whose every arm has one, a pair measured in part
runs again in full under new attempt numbers; the results say that, and
when, the run was resumed.
The driver's loop runs here with its engines replaced by a recorder (the
engines are not what these tests are about: tests/test_vs_vllm.py and the
benchmark's own runs measure them).
"""

from __future__ import annotations

import json
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import resume


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_the_code_version_changes_with_the_measured_files_and_is_none_while_they_are_uncommitted(tmp_path):
    repo = tmp_path
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@t")
    _git(repo, "config", "user.name", "t")
    (repo / "patches").mkdir()
    (repo / "patches" / "a.py").write_text("x = 1\n")
    (repo / "README.md").write_text("not measured\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    paths = ("patches",)
    first = resume.code_version(repo, paths)
    assert first is not None and first.startswith("tree:")

    (repo / "README.md").write_text("changed, still not measured\n")
    assert resume.code_version(repo, paths) == first  # a file outside the measured paths changes nothing

    (repo / "patches" / "a.py").write_text("x = 2\n")
    assert resume.code_version(repo, paths) is None  # uncommitted: nothing vouches for it
    (repo / "patches" / "new.py").write_text("")
    _git(repo, "add", ".")
    assert resume.code_version(repo, paths) is None  # staged is not committed
    _git(repo, "commit", "-q", "-m", "two")
    second = resume.code_version(repo, paths)
    assert second is not None and second != first

    assert resume.code_version(tmp_path / "nowhere", paths) is None  # not a git checkout
    assert resume.code_version(repo, ("no_such_dir",)) is None


def _meta(**changes: object) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "machine": "AMD EPYC, x86_64, 2 CPUs, 24 GiB",
        "code": "tree:abc",
        "workload": {"name": "cold", "arms": ["plain", "shipped"], "pairs": 6, "seed": 0, "working_sets": (0.5, 1.5)},
    }
    for key, value in changes.items():
        if key in ("machine", "code"):
            meta[key] = value
        else:
            meta["workload"] = {**meta["workload"], key: value}
    return meta


def test_only_the_same_measurement_on_the_same_machine_and_code_may_be_resumed():
    recorded = json.loads(json.dumps(_meta()))  # as read back from vs_vllm.json (tuples become lists)
    resume.check_same(recorded, _meta())
    for now, names in (
        (_meta(pairs=8), "pairs: recorded 6, now 8"),
        (_meta(seed=1), "seed"),
        (_meta(arms=["plain", "stock"]), "arms"),
        (_meta(machine="Intel Xeon, x86_64, 2 CPUs, 24 GiB"), "another machine"),
        (_meta(code="tree:def"), "code under test changed"),
        (_meta(code=None), "cannot vouch"),
    ):
        with pytest.raises(resume.ResumeRefused, match=names):
            resume.check_same(recorded, now)
    with pytest.raises(resume.ResumeRefused, match="does not exist"):
        resume.load(Path("/nonexistent"))


def _row(pair, stack, label, void=None, attempt=0):
    return {"pair": pair, "stack": stack, "label": label, "void": void, "attempt": attempt}


def test_a_pair_is_kept_only_with_a_valid_run_of_every_arm_at_every_label():
    arms, labels = ["plain", "shipped"], ["c1", "c8"]
    runs = [
        # pair 0: whole (shipped's void c8 was measured again, valid)
        *[_row(0, a, lab) for a in arms for lab in labels if (a, lab) != ("shipped", "c8")],
        _row(0, "shipped", "c8", void="stalled"),
        _row(0, "shipped", "c8", attempt=1),
        # pair 1: plain whole, shipped's c8 void with no valid run after it: the pair runs again
        _row(1, "plain", "c1"),
        _row(1, "plain", "c8"),
        _row(1, "shipped", "c1"),
        _row(1, "shipped", "c8", void="1 failed request(s)"),
        # pair 2: one arm only (stopped half-way): runs again in full
        _row(2, "plain", "c1"),
        _row(2, "plain", "c8"),
    ]
    assert resume.done_phases(runs, labels, arms) == {(0, "plain"), (0, "shipped")}
    assert resume.next_attempt(runs, 0, "shipped") == 2
    assert resume.next_attempt(runs, 2, "plain") == 1
    assert resume.next_attempt(runs, 2, "shipped") == 0


class _Stopped(KeyboardInterrupt):
    pass


@pytest.fixture
def driver(monkeypatch, tmp_path):
    """benchmarks.vs_vllm.main with its arms replaced by a recorder of the phases it runs; ``stop_after`` phases
    it raises Ctrl-C's exception as a stopped run does; ``void`` names phases (pair, arm, attempt) whose c8 run
    is void."""
    from benchmarks import vs_vllm
    from benchmarks.harness.runs import Run

    calls: list[tuple[int, str, int]] = []
    state: dict[str, Any] = {"stop_after": None, "void": set()}

    @contextmanager
    def fake_arm(stack, config, model, work):
        yield type("Arm", (), {"replicas": 1})()

    def fake_phase(arm, stack, pair, workload, plan, model, work, sampler, attempt=0, baseline=None):
        if state["stop_after"] is not None and len(calls) >= state["stop_after"]:
            raise _Stopped
        calls.append((pair, stack, attempt))
        out = []
        for label, c in workload.runs():
            void = "stalled" if label == "c8" and (pair, stack, attempt) in state["void"] else None
            run = Run(
                stack=stack, pair=pair, label=label, concurrency=c, completed=10, failed=0, duration_s=1.0,
                req_per_s=10.0 + pair, output_tok_per_s=1.0, ttft_ms={"p50": 5.0, "p99": 9.0},
                tpot_ms={"p50": 1.0, "p99": 2.0}, itl_ms={"p50": 1.0, "p99": 2.0}, e2el_ms={"p50": 9.0, "p99": 9.0},
                window_s=1.0, host_cpu_s=1.0, host_cpu_s_per_request=0.1, host_busy_cores=1.0,
            )  # fmt: skip
            run.void, run.attempt = void, attempt
            out.append(run)
        return out

    class FakeSampler:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class FakeConfig:
        pass

    monkeypatch.setattr(vs_vllm, "make_arm", fake_arm)
    monkeypatch.setattr(vs_vllm, "run_phase", fake_phase)
    monkeypatch.setattr(vs_vllm, "HostCpuSampler", FakeSampler)
    monkeypatch.setattr(vs_vllm, "require_no_ray", lambda when: None)
    monkeypatch.setattr(vs_vllm, "use_engine_env", lambda: None)
    monkeypatch.setattr(vs_vllm, "stop_on_term", lambda: None)
    monkeypatch.setattr(vs_vllm, "load_config", lambda path: FakeConfig())
    monkeypatch.setattr(vs_vllm, "local_pool_tokens", lambda config, model: 4096)
    monkeypatch.setattr(vs_vllm, "model_config", lambda config: type("M", (), {"engine_kwargs": {}})())
    monkeypatch.setattr(vs_vllm, "prompt_plan", lambda *a: {})
    monkeypatch.setattr(vs_vllm, "plot", lambda runs, path: None)
    monkeypatch.setattr(vs_vllm.client_priority, "choose", lambda sched: (sched, None))
    monkeypatch.setattr(vs_vllm.client_priority, "apply_result", lambda sched: sched)
    monkeypatch.setattr(resume, "code_version", lambda *a: "tree:same")
    import fixture_model.build

    monkeypatch.setattr(fixture_model.build, "ensure_model", lambda: tmp_path / "model")
    out = tmp_path / "out"
    args = ["--arms", "plain,shipped", "--pairs", "2", "--smoke", "--requests", "1:4,8:4", "--chat", ""]
    args += ["--out", str(out)]
    return vs_vllm.main, calls, state, args, out


def test_a_resumed_run_keeps_the_whole_pairs_and_runs_the_rest_in_full(driver):
    main, calls, state, args, out = driver
    state["stop_after"] = 4  # stopped during the fifth phase: pair 0 whole, pair 1 with one arm measured
    state["void"] = {(0, "shipped", 0)}  # pair 0 shipped's first attempt is void, its re-run (attempt 1) valid
    with pytest.raises(_Stopped):
        main(args)
    assert calls == [(0, "plain", 0), (0, "shipped", 0), (0, "shipped", 1), (1, "shipped", 0)]
    first = json.loads((out / "vs_vllm.json").read_text())
    assert len(first["runs"]) == 8

    calls.clear()
    state["stop_after"] = None
    assert main([*args, "--resume"]) == 0
    # pair 0 kept; pair 1 in full, its shipped phase measured again in this sitting (attempt 1)
    assert calls == [(1, "shipped", 1), (1, "plain", 0)]
    data = json.loads((out / "vs_vllm.json").read_text())
    assert len(data["runs"]) == 8 + 2 * 2  # the earlier sitting's runs, the void one included, and the new ones
    assert [r["attempt"] for r in data["runs"] if (r["pair"], r["stack"]) == (1, "shipped")] == [0, 0, 1, 1]
    meta = data["meta"]
    assert meta["command"] == first["meta"]["command"] and len(meta["sittings"]) == 2
    assert any(p.startswith("resumed ") and "2 of 4 phases kept" in p for p in meta["protocol"])
    assert "Sittings (a stopped run resumed)" in (out / "vs_vllm.md").read_text()
    assert data["ratios"]["c8"]["shipped/plain"]["figures"]["req_per_s"]["pairs"] == 2

    calls.clear()
    assert main([*args, "--resume"]) == 0  # nothing left to run: a finished run resumed runs nothing
    assert calls == []


def test_a_resume_that_would_measure_something_else_is_refused_and_runs_nothing(driver, capsys):
    main, calls, state, args, out = driver
    state["stop_after"] = 1
    with pytest.raises(_Stopped):
        main(args)
    calls.clear()
    other = [a if a != "1:4,8:4" else "1:4,8:8" for a in args]  # more prompts per run at 8 in flight
    with pytest.raises(SystemExit) as stop:
        main([*other, "--resume"])
    assert stop.value.code == 2 and calls == []
    assert "another measurement: requests" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args[:-1], str(out.parent / "elsewhere"), "--resume"])  # nothing recorded there
    assert calls == []
