"""KV offloading, fault injection and the accounting patch on real engines, at concurrency.

Every scenario runs the same 48 requests (6 long shared prefixes, a small KV
pool: prefix-cache hits, offload-tier reloads, preemptions) all submitted at
once, and checks: no engine death, every request completes, no counter is
negative, the prompt-token counters sum, the violation/correction counters
explain the injected faults, and greedy outputs equal the fault-free run.
The last test switches the accounting patch off and asserts the lying
connector does break the engine.

The engines here are vLLM's one-process engine (tests/conftest.py,
``ONE_PROCESS_ENV``): the subject is what the scheduler, the connector and
the counters compute, not the process layout. The same faults run through
Serve, EngineCore in a process of its own, in tests/test_load_ab.py
(chaos-lite).
"""

from __future__ import annotations

import functools

import pytest

from patches.framework.switches import OFF_ENV
from patches.kv_faults import worker_stats
from testkit.accounting_workload import (
    MAX_TOKENS,
    check_invariants,
    metrics,
    offload_engine_kwargs,
    prompts,
    run_with_aborts,
)
from testkit.engine_host import EngineError

pytestmark = pytest.mark.engine

PROMPTS = prompts()
BLOCK_SIZE = 128  # the CPU platform's KV block
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="module")
def start_in_one_process(start_engine):
    """Starts a one-process engine: ``start_in_one_process(env, **llm_kwargs)``."""
    return functools.partial(start_engine, one_process=True)


def _run(engine):
    outs = engine.generate(PROMPTS, GREEDY)
    assert engine.alive()
    assert [o["finish_reason"] for o in outs] == ["length"] * len(PROMPTS), "every request completes"
    m = engine.eval(metrics)
    assert check_invariants(m) == [], m
    return [o["token_ids"] for o in outs], m


@pytest.fixture(scope="module")
def reference(start_in_one_process):
    """Fault-free run with offloading on, and the same run with offloading off."""
    on = start_in_one_process(**offload_engine_kwargs())
    out_on, m_on = _run(on)
    stats = on.rpc(worker_stats)
    on.close()
    off = start_in_one_process(enforce_eager=True, num_gpu_blocks_override=24, max_num_seqs=16)
    out_off, _ = _run(off)
    off.close()
    return {"outputs": out_on, "outputs_no_offload": out_off, "metrics": m_on, "worker": stats[0]}


def violations(m, prefix="vllm:prompt_token_accounting_violations"):
    return {k.split("{")[1].rstrip("}"): v for k, v in m.items() if k.startswith(prefix + "{") and v}


def test_offload_tier_is_used_and_changes_nothing(reference):
    m = reference["metrics"]
    assert m["vllm:prompt_tokens_by_source{external_kv_transfer}"] > 0, "prefixes were reloaded from the offload tier"
    assert m["vllm:prompt_tokens_cached_by_source{host}"] > 0
    assert m["vllm:prompt_tokens_by_source{local_cache_hit}"] > 0
    assert reference["worker"]["bytes_loaded"] > 0 and reference["worker"]["bytes_stored"] > 0
    assert m["vllm:prompt_tokens_by_source{external_kv_transfer}"] <= reference["worker"]["blocks_loaded"] * BLOCK_SIZE
    assert reference["outputs"] == reference["outputs_no_offload"], "greedy outputs identical with offloading on/off"
    assert violations(m) == {}, "a fault-free run breaks no invariant"


def test_load_failures_are_recomputed_and_accounted(start_in_one_process, reference):
    engine = start_in_one_process(**offload_engine_kwargs({"seed": 1, "load_failure_rate": 0.1, "load_delay_ms": 3}))
    outputs, m = _run(engine)
    [w] = engine.rpc(worker_stats)
    engine.close()
    assert w["failed_loads"] > 0, "the scenario must actually fail some loads"
    assert m["vllm:prompt_token_accounting_corrections{after_load_failure}"] > 0
    assert violations(m) == {}, "load failures are handled, not violations"
    # Failed loads copy nothing; the corrected stats count only what arrived.
    # (Upstream keeps the optimistic count and would count failed blocks too.)
    assert 0 < m["vllm:prompt_tokens_by_source{external_kv_transfer}"] <= w["blocks_loaded"] * BLOCK_SIZE
    assert outputs == reference["outputs"]


def test_lying_connector_is_clamped(start_in_one_process, reference):
    engine = start_in_one_process(**offload_engine_kwargs({"seed": 2, "lying_rate": 0.3}))
    outputs, m = _run(engine)
    engine.close()
    v = violations(m)
    assert v.get("connector_negative", 0) > 0 and v.get("connector_exceeds_prompt", 0) > 0, v
    assert set(v) <= {"connector_negative", "connector_exceeds_prompt", "connector_async_without_tokens"}, v
    assert outputs == reference["outputs"]


def test_preemption_storm_and_client_aborts(start_in_one_process, reference):
    """Long generations in a 16-block pool: admitted requests outgrow it and preempt each other."""
    engine = start_in_one_process(**offload_engine_kwargs(blocks=16))
    outs = engine.generate(PROMPTS, {"temperature": 0, "max_tokens": 128})
    assert [o["finish_reason"] for o in outs] == ["length"] * len(PROMPTS)
    m = engine.eval(metrics)
    assert m["vllm:num_preemptions"] >= 10, m
    assert check_invariants(m) == [] and violations(m) == {}
    # greedy: the first tokens of a longer generation are the shorter one's
    assert [o["token_ids"][:MAX_TOKENS] for o in outs] == reference["outputs"]
    aborts = engine.eval(run_with_aborts, PROMPTS)
    assert aborts["aborted"], "some requests were aborted mid-generation"
    for i, toks in aborts["finished"].items():
        assert toks == reference["outputs"][i]
    assert len(aborts["finished"]) + len(aborts["aborted"]) == len(PROMPTS), "nothing lost"
    m = engine.eval(metrics)
    engine.close()
    assert check_invariants(m) == []
    assert violations(m) == {}


def test_without_the_accounting_patch_the_lying_connector_breaks_the_engine(start_in_one_process):
    """The checker can fail: stock accounting under the same lies dies or goes negative."""
    engine = start_in_one_process({OFF_ENV: "accounting"}, **offload_engine_kwargs({"seed": 2, "lying_rate": 0.3}))
    try:
        outs = engine.generate(PROMPTS, GREEDY)
    except EngineError as e:
        assert e.type_name in ("EngineDeadError", "ValueError", "AssertionError"), e
    else:
        m = engine.eval(metrics)
        problems = check_invariants(m)
        failed = [o for o in outs if o["finish_reason"] != "length"]
        assert problems or failed, "stock accounting survived lies it cannot survive; the scenario is too weak"
    finally:
        engine.close()


def test_fuzz_settings_never_share_kv_through_the_offload_tier(start_in_one_process, patched_engine):
    """s=0 computes a prefix; it is evicted to the offload tier; s=1 must not reload it, s=0 must.

    References come from the shared patched engine (no offloading), where
    this prompt was never run: uncached.
    """
    target = PROMPTS[0]
    evictors = [p for p in PROMPTS if not p.startswith(target[:200])][:4]
    neutral = {**GREEDY, "extra_args": None}
    fuzzed = {**GREEDY, "extra_args": {"fuzz_strength": 1.0, "fuzz_mode": "gaussian", "fuzz_seed": 3}}
    uncached = {
        name: patched_engine.generate([target], p)[0]["token_ids"]
        for name, p in (("neutral", neutral), ("fuzzed", fuzzed))
    }
    assert uncached["neutral"] != uncached["fuzzed"]
    engine = start_in_one_process(**offload_engine_kwargs(blocks=12))

    def run(params):
        before = engine.eval(metrics)
        out = engine.generate([target], params)[0]["token_ids"]
        after = engine.eval(metrics)
        return out, {
            src: after[f"vllm:prompt_tokens_by_source{{{src}}}"] - before[f"vllm:prompt_tokens_by_source{{{src}}}"]
            for src in ("external_kv_transfer", "local_cache_hit")
        }

    out, hits = run(neutral)
    assert out == uncached["neutral"] and hits == {"external_kv_transfer": 0, "local_cache_hit": 0}
    engine.generate(evictors, GREEDY)  # push the target's blocks out of the 12-block pool, into the tier
    out, hits = run(fuzzed)
    assert out == uncached["fuzzed"], "another fuzz setting computes its own KV"
    assert hits == {"external_kv_transfer": 0, "local_cache_hit": 0}, "and reuses none of s=0's, from either tier"
    engine.generate(evictors, GREEDY)
    out, hits = run(neutral)
    assert out == uncached["neutral"] and hits["external_kv_transfer"] > 0, "s=0 reloads its own blocks from the tier"
    engine.close()
