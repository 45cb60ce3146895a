"""Reading per-replica counters out of Ray's and vLLM's Prometheus text (pure parsing)."""

from __future__ import annotations

import json

import pytest

from load_tests.observe.counters import ReplicaCounters, canonical
from load_tests.observe.invariants import negative, quiescence
from load_tests.observe.replica_metrics import table_check
from load_tests.observe.scraper import discover_metrics_urls, merge_pages, replica_counters


def sums(rc: ReplicaCounters) -> list[str]:
    """The counters' identities that hold at rest (never negative, parts summing to the total), as messages."""
    return [f.message for f in negative(rc) + quiescence(rc)]


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
    assert sums(r1) == []
    assert r2.violations == {"connector_negative": 2}
    [problem] = sums(r2)
    assert "41" in problem and "40" in problem, "the checker reports a sum mismatch"


def test_plain_vllm_server_is_one_replica():
    reps = replica_counters(VLLM)
    assert list(reps) == ["vllm"]
    assert reps["vllm"].prompt_tokens == 12 and reps["vllm"].waiting == 1 and sums(reps["vllm"]) == []


@pytest.mark.parametrize(
    "bad, needle",
    [
        (ReplicaCounters("r", prompt_tokens=5, by_source={"local_compute": 6, "local_cache_hit": -1}), "= -1"),
        (ReplicaCounters("r", prompt_tokens=5, prompt_tokens_cached=6, by_source={"local_compute": 5}), "cached"),
        (ReplicaCounters("r", prompt_tokens=float("nan")), "nan"),
    ],
)
def test_sum_checker_catches_bad_snapshots(bad, needle):
    assert any(needle in p for p in sums(bad)), sums(bad)


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


HEALTH = """\
# TYPE ray_serve_deployment_replica_healthy gauge
ray_serve_deployment_replica_healthy{application="fuzzserve",deployment="LLMServer:fixture",replica="r1"} 1.0
ray_serve_deployment_replica_healthy{application="fuzzserve",deployment="LLMServer:fixture",replica="r2"} 0.0
ray_serve_deployment_replica_healthy{application="fuzzserve",deployment="FuzzIngress",replica="ingress"} 1.0
"""


def test_one_scrape_of_every_endpoint_merges_replicas_health_and_errors():
    result = merge_pages(
        [
            ("http://head/metrics", RAY + HEALTH),
            ("http://worker/metrics", VLLM),
            ("http://gone/metrics", ConnectionError("refused")),
        ]
    )
    assert set(result.replicas) == {"r1", "r2", "vllm"}, "the ingress has a health gauge but no engine: not a replica"
    r1, r2 = result.replicas["r1"], result.replicas["r2"]
    assert (r1.healthy, r1.alive) == (1.0, True)
    assert (r2.healthy, r2.alive) == (0.0, False), "Serve says 0: dead, whatever its gauges"
    assert result.replicas["vllm"].healthy is None and result.replicas["vllm"].alive, "no health gauge: its gauges tell"
    assert result.errors == {"http://gone/metrics": "ConnectionError: refused"}
    assert result.problems() == ["http://gone/metrics could not be read: ConnectionError: refused"]


def test_a_replica_reported_by_two_endpoints_is_an_error():
    result = merge_pages([("http://a/metrics", RAY), ("http://b/metrics", RAY)])
    assert result.duplicates == {
        "r1": ["http://a/metrics", "http://b/metrics"],
        "r2": ["http://a/metrics", "http://b/metrics"],
    }
    assert result.replicas["r1"].node == "http://a/metrics", "kept once, from the first endpoint"
    assert any("replica r1 reported by 2 endpoints" in p for p in result.problems())


def test_unparsable_text_is_an_unreadable_endpoint():
    result = merge_pages([("http://x/metrics", 'ray_vllm_prompt_tokens_total{ReplicaId="r1" 5\n')])
    assert list(result.errors) == ["http://x/metrics"] and "unparsable" in result.errors["http://x/metrics"]


def test_the_table_checks_only_what_holds_for_each_replica():
    idle = ReplicaCounters("r", prompt_tokens=5, by_source={"local_compute": 4}, gauges=True)
    assert "!= prompt_tokens" in table_check(idle)[0] and table_check(idle)[1]
    busy = ReplicaCounters("r", prompt_tokens=5, by_source={"local_compute": 4}, running=1, gauges=True)
    assert table_check(busy) == ("busy: sums checked at rest", [])
    dead = ReplicaCounters("r", prompt_tokens=5, by_source={"local_compute": 4}, healthy=0.0)
    assert table_check(dead)[1] == [] and table_check(dead)[0].startswith("dead")
    negative_dead = ReplicaCounters("r", prompt_tokens=-1, healthy=0.0)
    assert table_check(negative_dead)[1], "never negative holds for every replica, dead or alive"


def test_the_counters_cli_exits_1_on_any_problem(tmp_path, capsys):
    """python -m load_tests.observe.replica_metrics against an echo-server target: healthy, then broken."""
    import asyncio
    import threading

    from load_tests.observe.replica_metrics import main
    from testkit import echo_server

    loop = asyncio.new_event_loop()
    runner, server, port = loop.run_until_complete(echo_server.start(fault="sum_mismatch", fault_after=0))
    threading.Thread(target=loop.run_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        server.replicas[0].prompt_tokens = server.replicas[1].prompt_tokens = 7
        server.replicas[0].finished = server.replicas[1].finished = {"length": 1}
        assert main(["--metrics-url", url, "--json"]) == 1
        assert "echo-0: local_compute + local_cache_hit + external_kv_transfer = 8" in capsys.readouterr().out
        server.fault = None
        assert main(["--metrics-url", url]) == 0
        assert main(["--metrics-url", url, "--metrics-url", url]) == 1, "the same replicas from two endpoints"
        assert "reported by 2 endpoints" in capsys.readouterr().err
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
