"""Reading per-replica counters out of Ray's and vLLM's Prometheus text (pure parsing)."""

from __future__ import annotations

import json

import pytest

from load_tests.replica_metrics import ReplicaCounters, canonical, discover_metrics_urls, replica_counters

RAY = """\
# HELP ray_vllm_prompt_tokens_total Number of prefill tokens processed.
# TYPE ray_vllm_prompt_tokens_total counter
ray_vllm_prompt_tokens_total{ReplicaId="r1",WorkerId="w1",engine="0",model_name="fixture"} 100.0
ray_vllm_prompt_tokens_total{ReplicaId="r2",WorkerId="w2",engine="0",model_name="fixture"} 40.0
# TYPE ray_vllm_prompt_tokens_by_source_total counter
ray_vllm_prompt_tokens_by_source_total{ReplicaId="r1",engine="0",source="local_compute"} 60.0
ray_vllm_prompt_tokens_by_source_total{ReplicaId="r1",engine="0",source="local_cache_hit"} 30.0
ray_vllm_prompt_tokens_by_source_total{ReplicaId="r1",engine="0",source="external_kv_transfer"} 10.0
ray_vllm_prompt_tokens_by_source_total{ReplicaId="r2",engine="0",source="local_compute"} 41.0
# TYPE ray_vllm_prompt_tokens_cached_total counter
ray_vllm_prompt_tokens_cached_total{ReplicaId="r1",engine="0"} 40.0
# TYPE ray_vllm_request_success_total counter
ray_vllm_request_success_total{ReplicaId="r1",engine="0",finished_reason="length"} 3.0
ray_vllm_request_success_total{ReplicaId="r1",engine="0",finished_reason="abort"} 1.0
# TYPE ray_vllm_prompt_token_accounting_violations_total counter
ray_vllm_prompt_token_accounting_violations_total{ReplicaId="r2",kind="connector_negative"} 2.0
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{ReplicaId="r1",engine="0"} 2.0
# TYPE ray_serve_num_http_requests_total counter
ray_serve_num_http_requests_total{route="/"} 7.0
"""

VLLM = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="fixture"} 12.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="fixture",source="local_compute"} 12.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="fixture"} 1.0
"""


def test_ray_export_is_split_per_replica():
    reps = replica_counters(RAY, node="n1")
    assert set(reps) == {"r1", "r2"}, "Serve's own metrics are not replicas"
    r1, r2 = reps["r1"], reps["r2"]
    assert (r1.prompt_tokens, r1.prompt_tokens_cached, r1.running, r1.node) == (100, 40, 2, "n1")
    assert r1.by_source == {"local_compute": 60, "local_cache_hit": 30, "external_kv_transfer": 10}
    assert r1.requests_finished == {"length": 3, "abort": 1} and r1.requests_total == 4
    assert r1.sum_problems() == []
    assert r2.violations == {"connector_negative": 2}
    [problem] = r2.sum_problems()
    assert "41" in problem and "40" in problem, "the checker reports a sum mismatch"


def test_plain_vllm_server_is_one_replica():
    reps = replica_counters(VLLM)
    assert list(reps) == ["vllm"]
    assert reps["vllm"].prompt_tokens == 12 and reps["vllm"].waiting == 1 and reps["vllm"].sum_problems() == []


@pytest.mark.parametrize("bad, needle", [
    (ReplicaCounters("r", prompt_tokens=5, by_source={"local_compute": 6, "local_cache_hit": -1}), "= -1"),
    (ReplicaCounters("r", prompt_tokens=5, prompt_tokens_cached=6, by_source={"local_compute": 5}), "cached"),
    (ReplicaCounters("r", prompt_tokens=float("nan")), "nan"),
])
def test_sum_checker_catches_bad_snapshots(bad, needle):
    assert any(needle in p for p in bad.sum_problems()), bad.sum_problems()


def test_counter_names():
    assert canonical("ray_vllm_prompt_tokens_total") == ("vllm:prompt_tokens", True)
    assert canonical("vllm:num_requests_running") == ("vllm:num_requests_running", False)
    assert canonical("ray_serve_num_http_requests_total") is None


def test_discovery_file(tmp_path):
    f = tmp_path / "sd.json"
    f.write_text(json.dumps([{"labels": {"job": "ray"}, "targets": ["10.0.0.1:8089", "10.0.0.2:8090"]}]))
    assert discover_metrics_urls(f) == ["http://10.0.0.1:8089/metrics", "http://10.0.0.2:8090/metrics"]
    with pytest.raises(FileNotFoundError, match="--metrics-url"):
        discover_metrics_urls(tmp_path / "missing.json")
