"""The upstream-tests runner's verdict (testkit/upstream_vllm.py), on synthetic results: it can fail.

The runner itself is optional and slow (it fetches vLLM's sdist and runs
hundreds of upstream tests twice); this checks, fast, that its comparison
flags an unlisted difference, accepts a listed one, and never counts a test
this host cannot run as a pass.
"""

from __future__ import annotations

import pytest

from testkit import upstream_vllm as up

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.v1.a" name="test_ok" time="0.1"/>
<testcase classname="tests.v1.a" name="test_gpu" time="0.1"><skipped message="Requires CUDA">x</skipped></testcase>
<testcase classname="tests.v1.a" name="test_boom" time="0.1"><failure message="assert 1 == 2">E assert</failure></testcase>
</testsuite></testsuites>"""  # noqa: E501


def test_junit_outcomes(tmp_path):
    (tmp_path / "j.xml").write_text(JUNIT)
    got = up.read_junit(tmp_path / "j.xml")
    assert {k: v[0] for k, v in got.items()} == {
        "tests.v1.a::test_ok": "passed",
        "tests.v1.a::test_gpu": "skipped",
        "tests.v1.a::test_boom": "failed",
    }


def rows(on, off):
    return {r["test"]: r for r in up.compare(on, off)}


def test_same_outcomes_pass_or_are_not_applicable_never_counted_as_passes():
    on = off = {
        "t::ok": ("passed", ""),
        "t::gpu": ("skipped", "Requires CUDA"),
        "t::hub": ("failed", "LocalEntryNotFoundError: Cannot find an appropriate cached snapshot"),
        "t::pkg": ("error", "ModuleNotFoundError: No module named 'nixl'"),
        "t::bug": ("failed", "assert 3 == 4"),
    }
    r = rows(on, off)
    assert r["t::ok"]["verdict"] == "passed"
    assert {r[t]["verdict"] for t in ("t::gpu", "t::hub", "t::pkg")} == {"not applicable"}
    assert r["t::pkg"]["note"] == "needs the package nixl"
    assert r["t::bug"]["verdict"] == "fails both ways", "a real failure on this host is not 'not applicable'"


def test_a_difference_fails_unless_listed_as_deliberate(monkeypatch):
    on, off = {"t::x": ("failed", "ValidationError: FaultConfig")}, {"t::x": ("passed", "")}
    assert rows(on, off)["t::x"]["verdict"] == "DIFFERS"
    monkeypatch.setitem(up.DELIBERATE, "t::x", "the patch changes this on purpose")
    assert rows(on, off)["t::x"]["verdict"] == "deliberate"
    assert rows({"t::y": ("passed", "")}, {})["t::y"]["verdict"] == "DIFFERS", "a test missing from one run differs"


@pytest.mark.parametrize("areas", [["metrics stats"], list(up.AREAS)])
def test_every_area_names_upstream_test_paths(areas):
    paths = [p for a in areas for p in up.AREAS[a].paths]
    assert paths and all(p.startswith("tests/") and ".." not in p for p in paths)


def test_every_patch_is_exercised_by_some_area():
    from patches import PATCH_MODULES

    covered = {patch for area in up.AREAS.values() for patch in area.patches}
    assert not covered & set(up.NO_AREA), "a patch an area exercises is not one without an area"
    missing = set(PATCH_MODULES) - covered - set(up.NO_AREA)
    assert not missing, f"patches no upstream area exercises, and not named in NO_AREA with why: {missing}"
    assert set(up.NO_AREA) <= set(PATCH_MODULES) and all(up.NO_AREA.values())


def test_junit_names_map_back_to_node_ids(tmp_path):
    (tmp_path / "tests" / "v1").mkdir(parents=True)
    (tmp_path / "tests" / "v1" / "test_m.py").write_text("")
    assert up.node_id(tmp_path, "tests.v1.test_m::test_x[a-b]") == "tests/v1/test_m.py::test_x[a-b]"
    assert up.node_id(tmp_path, "tests.v1.test_m.TestC::test_y") == "tests/v1/test_m.py::TestC::test_y"


def test_an_area_path_missing_from_the_sdist_fails_before_anything_runs(monkeypatch, tmp_path, capsys):
    """A path the sdist lacks would collect nothing and leave its area looking clean (it did: 0 tests ran for
    `OpenAI serving`, whose completion path was not in 0.32.0)."""
    area = "OpenAI serving"
    paths = up.AREAS[area].paths
    ran: list[object] = []
    monkeypatch.setattr(up, "ensure_tree", lambda: tmp_path)
    monkeypatch.setattr(up, "ensure_stand_in_configs", lambda: None)
    monkeypatch.setattr(up, "rerun_differences", lambda *a: None)

    def run_once(*args: object) -> dict[str, tuple[str, str]]:
        ran.append(args)
        return {}

    monkeypatch.setattr(up, "run_once", run_once)
    for path in paths[1:]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    out = ["--areas", area, "--out", str(tmp_path / "report.md")]
    assert up.main(out) == 2
    assert ran == [] and paths[0] in capsys.readouterr().err
    (tmp_path / paths[0]).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / paths[0]).write_text("")
    assert up.main(out) == 1  # every path there: the area runs (here: nothing collected, which fails too)
    assert len(ran) == 2
