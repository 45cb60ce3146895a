"""The benchmarks' prompts (benchmarks/harness/prompts.py) and the cache counters they are judged by
(benchmarks/harness/server_counters.py): a cold workload really never repeats a prompt, and the check that says so can
fail."""

from __future__ import annotations

import pytest

from benchmarks.harness.prompts import KEY_WORDS, PromptBook, PromptSet, check_disjoint, prompt_tokens, read_jsonl


def test_unique_prompts_have_the_asked_length_in_the_servers_tokens():
    from fixture_model.build import build_tokenizer

    tok = build_tokenizer()
    prompts = PromptBook(1).unique("run", 50, 128)
    lengths = {len(tok(p).input_ids) for p in prompts.prompts}
    assert lengths == {128} == {prompt_tokens(p) for p in prompts.prompts}
    assert tok.unk_token_id not in {i for p in prompts.prompts[:5] for i in tok(p).input_ids}, (
        "every word is in the vocabulary: no prompt collapses to <unk>"
    )


def test_a_headline_runs_prompt_sets_are_all_disjoint_warmups_included():
    """The plan of a full cold benchmark: every set, warm-ups included, shares no prompt with another, and no
    prompt repeats within a set; both arms of a pair send the same set (it is one object)."""
    from benchmarks.harness.workload import Workload, prompt_plan

    plan = prompt_plan(Workload(), pairs=6, seed=0, pool_tokens=1 << 20)
    assert check_disjoint(plan.values()) == []
    warmups = [s for (p, label), s in plan.items() if label == "warmup"]
    measured = [s for (p, label), s in plan.items() if label != "warmup"]
    assert len(warmups) == 6 and len(measured) == 36  # 6 pairs x (4 completions runs + 2 chat runs)
    firsts = [tuple(p.split()[:KEY_WORDS]) for s in measured for p in s.prompts]
    assert len(firsts) == len(set(firsts)) == sum(len(s) for s in measured)
    warm = {tuple(p.split()[:KEY_WORDS]) for s in warmups for p in s.prompts}
    assert not warm & set(firsts), "no warm-up prompt is a measured one"


def test_the_disjointness_check_sees_a_repeat_within_a_set_and_a_prompt_shared_across_sets():
    book = PromptBook(2)
    a, b = book.unique("a", 10, 64), book.unique("b", 10, 64)
    assert check_disjoint([a, b]) == []
    repeated = PromptSet("a-again", a.prompts + a.prompts[:1], "unique")
    assert check_disjoint([repeated]) == ["a-again: 1 prompt(s) repeat within the set"]
    leaked = PromptSet("b-leak", b.prompts + a.prompts[3:4], "unique")
    assert check_disjoint([a, leaked]) == ["b-leak: shares a prompt with a"]
    # two different seeds draw independently: only one book guarantees disjointness, and the check says so
    other = PromptBook(2).unique("same-seed", 10, 64)
    assert check_disjoint([a, other]) == ["same-seed: shares a prompt with a"]


def test_a_reuse_set_repeats_its_prefixes_on_purpose_and_nothing_else():
    book = PromptBook(5)
    s = book.reuse("ws", prefixes=4, prefix_blocks=2, suffix_tokens=8, rounds=3)
    assert len(s) == 12 and s.working_set_tokens == 4 * 256 and s.prefix_tokens == 256
    heads = [tuple(p.split()[:255]) for p in s.prompts]
    assert len(set(heads)) == 4 and all(heads.count(h) == 3 for h in set(heads))
    assert len(set(s.prompts)) == 12, "every request's suffix is its own"
    for r in range(3):  # each round visits every prefix once
        assert len(set(heads[4 * r : 4 * r + 4])) == 4
    assert {prompt_tokens(p) for p in s.prompts} == {256 + 8}
    assert check_disjoint([s, book.unique("cold", 20, 128)]) == []
    assert check_disjoint([s, PromptSet("copy", s.prompts[:1], "reuse")]) == ["copy: shares a prompt with ws"]


def test_prompts_round_trip_through_vllms_custom_dataset_file(tmp_path):
    s = PromptBook(4).unique("r", 5, 32)
    assert read_jsonl(s.write_jsonl(tmp_path / "r.jsonl")) == s.prompts
    (tmp_path / "bad.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1"):
        read_jsonl(tmp_path / "bad.jsonl")


def test_prompts_too_short_to_tell_apart_are_refused():
    with pytest.raises(ValueError, match="at least 16"):
        PromptBook(0).unique("x", 1, 10)


RAY_EXPORT = """# TYPE ray_vllm_prefix_cache_hits_total counter
ray_vllm_prefix_cache_hits_total{ReplicaId="a",model_name="fixture",engine="0"} 256.0
ray_vllm_prefix_cache_hits_total{ReplicaId="b",model_name="fixture",engine="0"} 128.0
# TYPE ray_vllm_external_prefix_cache_hits_total counter
ray_vllm_external_prefix_cache_hits_total{ReplicaId="a",model_name="fixture",engine="0"} 512.0
# TYPE ray_vllm_request_success_total counter
ray_vllm_request_success_total{ReplicaId="a",finished_reason="length"} 7.0
ray_vllm_request_success_total{ReplicaId="b",finished_reason="stop"} 3.0
# TYPE ray_vllm_prompt_tokens_by_source_total counter
ray_vllm_prompt_tokens_by_source_total{ReplicaId="a",source="external_kv_transfer"} 512.0
ray_vllm_prompt_tokens_by_source_total{ReplicaId="a",source="local_compute"} 100.0
# TYPE ray_vllm_num_requests_running gauge
ray_vllm_num_requests_running{ReplicaId="a"} 4.0
"""
VLLM_EXPORT = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="fixture"} 1280.0
vllm:prefix_cache_hits_total{engine="0",model_name="fixture"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="fixture"} 10.0
vllm:prompt_tokens_total{engine="0",model_name="fixture"} 1280.0
"""


def test_counters_are_read_the_same_from_vllm_and_from_rays_agents_summed_over_replicas():
    from benchmarks.harness.server_counters import parse_counters

    ray = parse_counters([RAY_EXPORT])
    assert (ray.requests, ray.prefix_cache_hits, ray.external_hits) == (10, 384, 512)
    assert ray.by_source == {"external_kv_transfer": 512, "local_compute": 100}
    assert ray.hit_tokens == 896 and ray.to_json()["offload_hit_tokens_per_request"] == pytest.approx(51.2)
    plain = parse_counters([VLLM_EXPORT])
    assert (plain.requests, plain.prompt_tokens, plain.prefix_cache_queries, plain.hit_tokens) == (10, 1280, 1280, 0)
    both = parse_counters([RAY_EXPORT, VLLM_EXPORT])  # one endpoint per node: summed
    assert both.requests == 20 and (both - ray).requests == 10 and (both - ray).by_source["local_compute"] == 0


def test_a_runs_counters_wait_until_the_server_has_counted_its_requests():
    from benchmarks.harness.server_counters import CacheCounters, wait_for_requests

    exports = iter([VLLM_EXPORT.replace("10.0", "4.0"), VLLM_EXPORT])  # Ray's agent lags, then catches up
    clock = iter(range(100))
    got = wait_for_requests(
        ["u"],
        CacheCounters(requests=2),
        8,
        get=lambda u: next(exports),
        clock=lambda: next(clock),
        sleep=lambda s: None,
    )
    assert got.requests == 10
    with pytest.raises(TimeoutError, match=r"counted 2 finished requests .* the client completed 8"):
        wait_for_requests(
            ["u"],
            CacheCounters(requests=2),
            8,
            timeout_s=5,
            get=lambda u: VLLM_EXPORT.replace("10.0", "4.0"),
            clock=lambda: next(clock),
            sleep=lambda s: None,
        )


HISTOGRAMS = """# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="fixture"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="fixture"} 0.2
vllm:time_to_first_token_seconds_count{engine="0",model_name="fixture"} 4.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_sum{engine="0",model_name="fixture"} 0.04
vllm:request_queue_time_seconds_count{engine="0",model_name="fixture"} 4.0
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_sum{engine="0",model_name="fixture"} 0.08
vllm:request_prefill_time_seconds_count{engine="0",model_name="fixture"} 4.0
"""


def test_the_time_to_first_token_splits_by_the_servers_own_histograms_over_a_run():
    from benchmarks.harness.server_counters import parse_counters

    before = parse_counters([HISTOGRAMS])
    # two more requests, 30 ms to first token each, 5 of it queued and 10 prefilling
    after = parse_counters(
        [HISTOGRAMS.replace("4.0", "6.0").replace("0.2", "0.26").replace("0.04", "0.05").replace("0.08", "0.1")]
    )
    assert before.latency_mean_ms() == pytest.approx({"server_ttft": 50.0, "queue": 10.0, "prefill": 20.0})
    assert (after - before).latency_mean_ms() == pytest.approx({"server_ttft": 30.0, "queue": 5.0, "prefill": 10.0})
    # Ray's agent re-observes buckets at their midpoints: its sums are not read (a Serve replica has no split)
    ray = HISTOGRAMS.replace("vllm:", "ray_vllm_")
    assert parse_counters([ray]).latency_mean_ms() == {"server_ttft": None, "queue": None, "prefill": None}
    assert parse_counters([HISTOGRAMS, ray]).latency_mean_ms() == before.latency_mean_ms()
    means = (after - before).to_json()["latency_mean_ms"]
    assert isinstance(means, dict) and means["queue"] == pytest.approx(5.0)
    # a server that times nothing (no histogram, or no request in the run) has no mean, never a zero
    assert parse_counters([VLLM_EXPORT]).latency_mean_ms() == {"server_ttft": None, "queue": None, "prefill": None}
    assert (before - before).latency_mean_ms()["prefill"] is None
