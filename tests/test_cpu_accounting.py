"""Per-role CPU accounting of the benchmarks (pure logic plus a real measurement of this process)."""

import time

import pytest

from benchmarks.harness import cpu_accounting
from benchmarks.serve_stack import cpu_columns


def test_own_cpu_is_measured_as_the_load_generator():
    before = cpu_accounting.snapshot()
    t = time.process_time()
    while time.process_time() - t < 0.3:  # burn 0.3 s of CPU in this process
        pass
    cpu = cpu_accounting.delta(before, cpu_accounting.snapshot())
    assert cpu["load generator"] == pytest.approx(0.3, abs=0.1)


def test_delta_counts_new_processes_from_zero_and_drops_the_dead():
    before = {1: ("Ray system", 5.0), 2: ("EngineCore", 1.0)}
    after = {1: ("Ray system", 5.5), 3: ("EngineCore", 0.25)}
    assert cpu_accounting.delta(before, after) == {"Ray system": 0.5, "EngineCore": 0.25}


def test_columns_attribute_roles_to_the_driven_target():
    cpu = {
        "load generator": 1.0,
        "Serve proxy": 2.0,
        "replica c:FuzzIngress": 3.0,
        "replica c:LLMServer:fixture": 4.0,
        "EngineCore of replica c:LLMServer:fixture": 5.0,
        "replica e:LLMServer:fixture": 0.5,
        "vLLM API server": 0.25,
        "Ray system": 0.125,
    }
    cols = cpu_columns(cpu, "c")
    assert cols == {
        "client": 1.0,
        "proxy": 2.0,
        "ingress": 3.0,
        "frontend": 4.0,
        "engine": 5.0,
        "Ray": 0.125,
        "idle targets": 0.75,
    }
    assert cpu_columns({"vLLM API server": 1.0, "EngineCore of vLLM API server": 2.0}, "a")["frontend"] == 1.0


def test_engine_processes_count_as_their_replicas_engine():
    own = {
        10: "replica c:LLMServer:fixture.handle_request",
        11: "EngineCore",
        12: None,
        20: "vLLM API server",
        21: "EngineCore",
        22: None,
        30: None,
    }
    parent = {10: 1, 11: 10, 12: 11, 20: 1, 21: 20, 22: 21, 30: 1}
    roles = cpu_accounting.resolve_roles(own, parent)
    assert roles[12] == roles[11] == "EngineCore of replica c:LLMServer:fixture.handle_request"  # the worker
    assert roles[22] == "EngineCore of vLLM API server" and roles[30] is None
    assert cpu_columns({roles[12]: 2.0}, "c")["engine"] == 2.0
