"""The benchmark commands run end to end on tiny sizes and write their result files.

No timing is asserted (benchmarks measure, tests check): only that every
target answered every request and the ratio table is complete.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.engine


def test_loadgen_capacity_side_by_side(tmp_path, fixture_model):
    from benchmarks import loadgen_capacity

    assert loadgen_capacity.main(["--requests", "60", "--concurrency", "20", "--output-tokens", "8",
                                  "--rounds", "1", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "loadgen_capacity.json").read_text())
    assert {r["client"] for r in data["runs"]} == {"fuzzserve load_tests", "vllm bench serve"}
    for r in data["runs"]:
        assert r["ok"] == 60 and r["server_received"] == 60 and r["req_per_s"] > 0
        assert 2 <= r["server_max_in_flight"] <= 20  # streams overlap (the echo server paces its tokens)
    assert "| vllm bench serve |" in (tmp_path / "loadgen_capacity.md").read_text()


def test_serve_stack_benchmark_tiny(tmp_path, fixture_model):
    from benchmarks import serve_stack

    assert serve_stack.main(["--phases", "offstack,ceiling", "--rounds", "1", "--requests", "6", "--concurrency", "3",
                             "--output-tokens", "4", "--variants", "plain,prefix", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "serve_stack.json").read_text())
    runs = data["runs"]
    assert {(r["target"], r["variant"]) for r in runs} == {(t, v) for t in ("a", "b", "c0", "c1", "ceil")
                                                          for v in ("plain", "prefix")}
    assert all(r["requests"] == 6 and r["req_per_s"] > 0 for r in runs)
    rows = {(r["target"], r["variant"]): r for r in data["ratios"]}
    assert rows[("a", "plain")]["req_per_s_x_a"] == pytest.approx(1.0)
    assert rows[("b", "prefix")]["req_per_s_x_a"] > 0 and rows[("ceil", "plain")]["req_per_s_x_a"] > 0
    md = (tmp_path / "serve_stack.md").read_text()
    assert "python -m benchmarks.serve_stack --phases offstack,ceiling" in md and "| c0 |" in md


def test_patch_overhead_benchmark_tiny(tmp_path, fixture_model):
    from benchmarks import patch_overhead

    assert patch_overhead.main(["--rounds", "1", "--requests", "4", "--output-tokens", "4", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "patch_overhead.json").read_text())
    seen = {(r["workload"], r["engine"]) for r in data["runs"]}
    assert seen == {(w, e) for w in ("decode", "prefill") for e in ("off", "on", "on+offload")} | {
        (f"{w}+fuzz", e) for w in ("decode", "prefill") for e in ("on", "on+offload")}
    assert all(r["req_per_s"] > 0 for r in data["runs"])
    rows = {(r["workload"], r["engine"]): r for r in data["table"]}
    assert rows[("decode", "off")]["x_off"] == pytest.approx(1.0)
    assert "| prefill+fuzz | on+offload |" in (tmp_path / "patch_overhead.md").read_text()
