"""The stress CLI's figures agree with vLLM's own ``bench serve`` (issue: figures a user can check with the field's
tools).

Both clients drive ``testkit/echo_server.py`` with deterministic latencies
(100 ms to the first token, 10 ms between tokens) and answers whose every
token's text is empty, the shape of a fuzzed greedy answer: a client that
timed text instead of tokens would have no TTFT here and fail. The real
deployment's figure is in docs/load_tests.md (``python -m
benchmarks.bench_agreement --url ...``).
"""

from __future__ import annotations

import gc
import os
import threading
import time

import pytest

from benchmarks.bench_agreement import FIGURES, compare_figures, main, verdict
from benchmarks.harness.inprocess_clients import on_cpu, openai_api_key


def test_our_cli_agrees_with_vllm_bench_serve_on_the_echo_server_sending_the_same_bodies(tmp_path, capsys):
    # two pairs (a smoke run: the protocol's six would take minutes), compared as the median of each pair's ratio
    bodies = tmp_path / "bodies.jsonl"
    code = main(
        [
            "--echo",
            "--concurrency",
            "8",
            "--requests",
            "192",
            "--input-len",
            "32",
            "--output-len",
            "32",
            "--pairs",
            "2",
            "--smoke",
            "--record-bodies",
            str(bodies),
            "--rate-interval",
            "0.05",
            "--out",
            str(tmp_path),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    result = json.loads((tmp_path / "agreement.json").read_text())
    assert result["verdict"] == "agrees" and result["below_protocol"]
    # issue 47: each client against the server's own rate over its run (the echo server: 8 answers every 0.41 s,
    # 24 waves a run: long enough for the server rate);
    # ours decides. vLLM's client, on runs of 12 waves, reads up to 7 % over the server here: its window's edges
    against = result["against_server"]
    assert against["ours"]["verdict"] == "agrees" and 0.95 < against["ours"]["median"] < 1.05, against
    assert 0.9 < against["vllm"]["median"] < 1.1 and against["vllm"]["verdict"] != "not comparable", against
    assert all(16 < against[who]["server_requests_per_s"] < 21 for who in against), against
    assert result["verdict_vs_server"] == "agrees" and "Against the server: ours AGREES" in out
    ours, vllm = result["ours"], result["vllm"]  # each client's median figures
    for run in result["runs"]["ours"]:
        assert run["passed"], run["failures"]
        assert run["ttft_requests"] == 192, "every stream that produced tokens has a TTFT, empty text or not"
    assert ours["requests"] == vllm["requests"] == 384
    # each client's CPU over its call alone: vLLM's start-up (importing vLLM, some 10 s of CPU) is not in its runs
    for run in result["runs"]["ours"] + result["runs"]["vllm"]:
        assert 0 < run["client_cpu_s"] < 9, run  # a run's own; with vLLM's import it would be 10 s more
    # the server's own latencies: 100 ms to the first token, 10 ms per token after it
    assert 0.095 < ours["ttft_p50_s"] < 0.15 and 0.0095 < ours["tpot_p50_s"] < 0.015
    # what the server received: 768 bodies, every prompt once, and the two clients' bodies equal but for the words
    received = [json.loads(line) for line in bodies.read_text().splitlines()]
    assert len(received) == 768 and {r["route"] for r in received} == {"/v1/completions"}
    prompts = [r["body"]["prompt"] for r in received]
    assert len(set(prompts)) == 768, "no prompt sent twice, by either client"
    assert {len(p.split()) for p in prompts} == {31}
    shapes = {json.dumps({**r["body"], "prompt": None}, sort_keys=True) for r in received}
    assert len(shapes) == 1, f"the clients' bodies differ beyond the prompt: {shapes}"
    (shape,) = shapes
    assert json.loads(shape) == {
        "model": "fixture",
        "prompt": None,
        "max_tokens": 32,
        "temperature": 0,
        "ignore_eos": True,
        "repetition_penalty": 1.0,
        "logprobs": None,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _runs(values):
    return [dict(zip(FIGURES, row, strict=False)) | {"ttft_p99_s": 1.0, "client_cpu_s": 1.0} for row in values]


def test_a_figure_agrees_only_when_its_whole_interval_is_within_the_tolerance():
    vllm = _runs([(20.0, 0.1, 0.01)] * 6)
    same = compare_figures(_runs([(20.0, 0.1, 0.01)] * 6), vllm)
    assert all(same[k]["verdict"] == "agrees" for k in FIGURES) and verdict(same) == "agrees"
    # ours 20 % off in every pair: the interval lies wholly outside 1 +- 0.15
    off = compare_figures(_runs([(24.0, 0.1, 0.01)] * 6), vllm)
    assert off["requests_per_s"]["verdict"] == "disagrees" and verdict(off) == "disagrees"
    # a median inside the tolerance with an interval reaching beyond it is not agreement
    wide = compare_figures(_runs([(20.0, 0.1, 0.01)] * 3 + [(26.0, 0.1, 0.01)] * 3), vllm)
    assert wide["requests_per_s"]["verdict"] == "inconclusive" and verdict(wide) == "inconclusive"


def test_pairs_are_compared_as_the_median_of_each_pairs_ratio():
    """A drifting host moves both clients of a pair: neighbours are compared, then the median is taken."""
    vllm = _runs([(20.0, 0.1, 0.01), (30.0, 0.15, 0.015), (20.0, 0.1, 0.01), (20.0, 0.1, 0.01)])
    ours = _runs([(20.0, 0.1, 0.01), (30.0, 0.15, 0.015), (20.0, 0.1, 0.01), (20.0, 0.1, 0.01)])
    assert compare_figures(ours, vllm)["requests_per_s"]["ratios"] == pytest.approx([1.0] * 4)


def test_a_figure_one_client_did_not_measure_is_not_comparable_and_void_pairs_count_nowhere():
    vllm = _runs([(20.0, 0.1, 0.01)] * 2)
    ours = _runs([(20.0, None, 0.01)] * 2)
    figures = compare_figures(ours, vllm)
    assert figures["ttft_p50_s"]["verdict"] == "not comparable" and verdict(figures) == "disagrees"
    ours = _runs([(20.0, 0.1, 0.01), (40.0, 0.1, 0.01)])
    ours[1]["void"] = "128 prompt tokens from the prefix cache"
    assert compare_figures(ours, vllm)["requests_per_s"]["ratios"] == [1.0]


def _spin(cpu_s: float) -> None:
    """Burn ``cpu_s`` seconds of this thread's own CPU (not wall time: the host may be busy)."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


def test_a_call_is_charged_every_thread_of_its_cpu_and_nothing_before_it():
    _spin(1.0)  # before the call: start-up, not counted

    def call():
        assert gc.get_freeze_count() > 0, "the heap from before the call is frozen while it runs"
        worker = threading.Thread(target=_spin, args=(0.3,))  # a client's thread counts as the client
        worker.start()
        _spin(0.1)
        worker.join()
        return "done"

    result, cpu = on_cpu(call)
    assert result == "done"
    assert 0.4 <= cpu < 0.9, cpu
    assert gc.get_freeze_count() == 0, "released after the call"


def test_the_heap_is_released_when_the_call_fails():
    def failing():
        raise RuntimeError("client failed")

    with pytest.raises(RuntimeError, match="client failed"):
        on_cpu(failing)
    assert gc.get_freeze_count() == 0


def test_vllms_key_is_set_for_its_run_and_restored_after(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "theirs-before")
    with openai_api_key("sk-run"):
        assert os.environ["OPENAI_API_KEY"] == "sk-run"
    assert os.environ["OPENAI_API_KEY"] == "theirs-before"
    monkeypatch.delenv("OPENAI_API_KEY")
    with openai_api_key("sk-run"):
        assert os.environ["OPENAI_API_KEY"] == "sk-run"
    assert "OPENAI_API_KEY" not in os.environ
    with openai_api_key(None):
        assert "OPENAI_API_KEY" not in os.environ


def test_the_servers_steady_rate_leaves_the_edges_out_and_needs_changes_in_the_middle():
    from benchmarks.harness.server_rate import steady_rate

    # 100 requests: a slow start (10 in the first 5 s), then 10 per second, a tail: the middle's rate is 10/s
    samples = [(0.0, 0.0), (5.0, 10.0)] + [(5.0 + k, 10.0 + 10 * k) for k in range(1, 9)] + [(20.0, 100.0)]
    rate = steady_rate(samples)
    assert rate is not None
    assert rate["requests_per_s"] == 10.0 and rate["changes"] >= 2
    assert steady_rate([(0.0, 5.0), (1.0, 5.0)]) is None, "nothing counted: no rate"
    assert steady_rate([(0.0, 0.0), (30.0, 100.0)]) is None, "one export for the whole run: too short to say"


def test_a_client_is_judged_against_the_server_over_its_runs():
    from benchmarks.bench_agreement import against_server

    runs = [{"requests_per_s": r, "server": {"requests_per_s": 100.0}} for r in (101.0, 99.0, 102.0, 100.0)]
    assert against_server(runs)["verdict"] == "agrees"
    far = [{"requests_per_s": r, "server": {"requests_per_s": 100.0}} for r in (116.0, 118.0, 120.0, 115.0)]
    assert against_server(far)["verdict"] == "disagrees", "a client reading 1.16x the server's count"
    assert against_server([{"requests_per_s": 10.0, "server": None}])["verdict"] == "not comparable"


def test_the_rate_sampler_reads_only_the_finished_requests_lines_of_every_endpoint():
    from benchmarks.harness.server_rate import finished_requests

    ray = (
        "# HELP ray_vllm_request_success_total x\n# TYPE ray_vllm_request_success_total counter\n"
        'ray_vllm_request_success_total{ReplicaId="a",finished_reason="length"} 120.0\n'
        'ray_vllm_request_success_total{ReplicaId="b",finished_reason="stop"} 3.0\n'
        'ray_vllm_request_success_total_created{ReplicaId="a"} 1.7e9\n'
        'ray_vllm_prompt_tokens_total{ReplicaId="a"} 9999.0\n'
    )
    plain = 'vllm:request_success_total{finished_reason="length",model_name="fixture"} 7.0 1732780000000\n'
    pages = {"http://ray/metrics": ray, "http://plain/metrics": plain}
    assert finished_requests(list(pages), get=pages.__getitem__) == 130.0


def test_each_run_carries_the_servers_own_latency_beside_the_clients():
    """A run's server-side TTFT / TPOT p50 come from the replicas' histograms over that run only, and the table
    sets their medians beside each client's; a run whose histograms could not be read has none."""
    import math

    from benchmarks.bench_agreement import server_side, table
    from load_tests.observe.counters import ReplicaCounters

    def rc(ttft, tpot):
        return ReplicaCounters(
            "r1",
            histograms={
                "ttft": {0.01: ttft[0], 0.02: ttft[1], math.inf: ttft[1]},
                "tpot": {0.005: tpot[0], 0.01: tpot[1], math.inf: tpot[1]},
            },
        )

    before, after = {"r1": rc((100, 100), (100, 100))}, {"r1": rc((100, 120), (100, 140))}
    got = server_side(before, after)
    assert got is not None
    assert got["ttft_p50_s"] == pytest.approx(0.015) and got["ttft_p50_bucket_s"] == (0.01, 0.02)
    assert got["tpot_p50_s"] == pytest.approx(0.0075) and got["ttft_count"] == 20 and got["itl_p50_s"] is None
    assert server_side(None, after) is None
    run = {"pair": 0, "requests_per_s": 10.0, "ttft_p50_s": 0.02, "tpot_p50_s": None, "server_latency": got}
    result = {"ours": {}, "vllm": {}, "figures": {}, "runs": {"ours": [run], "vllm": [dict(run, void="hits")]}}
    md = table(result)
    assert "| ours | 20.0 ms (1 runs) | 15.0 ms (1 runs) | - | 7.5 ms (1 runs) | - |" in md
    assert "| vllm | - | - | - | - | - |" in md, "a void run counts nowhere"
