"""The fuzz patch against real vLLM engines on the fixture model.

Each test compares a patched engine with stock vLLM (same install, patches
switched off), so every assertion that fuzz *changes* something would fail
with the patch off, and every assertion that s = 0 changes *nothing* would
fail if the patch leaked into neutral requests.
"""

from __future__ import annotations

import itertools
import random

import pytest

from fixture_model.tasks import WORDS, held_out_examples
from load_tests.load.fuzz_sweep import run_sweep
from patches.fuzz import worker_stats
from testkit.accounting_workload import metrics
from testkit.engine_host import EngineError
from testkit.engine_requests import MAX_TOKENS, PROMPTS, gauss, greedy, ids, scale

pytestmark = pytest.mark.engine


def long_prompt(seed: int, n_words: int = 400) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


# --------------------------------------------------------------------------


def test_neutral_requests_match_stock_vllm(patched_engine, stock_engine):
    stock = ids(stock_engine.generate(PROMPTS, greedy()))
    assert ids(patched_engine.generate(PROMPTS, greedy())) == stock
    assert ids(patched_engine.generate(PROMPTS, greedy(scale(0.0)))) == stock
    assert ids(patched_engine.generate(PROMPTS, greedy(gauss(0.0, seed=5)))) == stock


@pytest.mark.parametrize("xargs", [scale(1.0), gauss(3.0)], ids=["scale-1", "gaussian-3"])
def test_strong_fuzz_changes_every_output(patched_engine, stock_engine, xargs):
    stock = ids(stock_engine.generate(PROMPTS, greedy()))
    fuzzed = ids(patched_engine.generate(PROMPTS, greedy(xargs)))
    assert all(f != s for f, s in zip(fuzzed, stock, strict=False)), "every prompt's output should change"
    # and stock vLLM ignores the same argument entirely
    assert ids(stock_engine.generate(PROMPTS, greedy(xargs))) == stock


def test_mixed_batch_each_request_gets_its_own_perturbation(patched_engine, stock_engine):
    settings = [None, scale(1.0), gauss(1.0, seed=1), scale(0.0), gauss(1.0, seed=2), scale(0.9)] * 2
    mixed = ids(patched_engine.generate(PROMPTS, [greedy(x) for x in settings]))
    # the same request run alone (one-prompt batches) gives the same output
    alone = [ids(patched_engine.generate([p], greedy(x)))[0] for p, x in zip(PROMPTS, settings, strict=False)]
    assert mixed == alone
    stock = ids(stock_engine.generate(PROMPTS, greedy()))
    for out, ref, x in zip(mixed, stock, settings, strict=False):
        if x is None or x["fuzz_strength"] == 0:
            assert out == ref, "a neutral request must not be perturbed by its batch neighbours"
    assert sum(out != ref for out, ref in zip(mixed, stock, strict=False)) >= 6


def test_gaussian_is_reproducible_and_seeded(patched_engine):
    a = ids(patched_engine.generate(PROMPTS, greedy(gauss(1.0, seed=11))))
    b = ids(patched_engine.generate(PROMPTS[::-1], greedy(gauss(1.0, seed=11))))[::-1]
    assert a == b, "same seed, different batch order: same outputs"
    c = ids(patched_engine.generate(PROMPTS, greedy(gauss(1.0, seed=12))))
    assert a != c, "another seed draws other noise"


def test_perturbation_happens_where_the_model_runs(patched_engine, stock_engine):
    [before] = patched_engine.rpc(worker_stats)
    assert before["installed"] and before["module"] == "model.embed_tokens"
    assert before["pid"] != patched_engine.pid, "the model runs in another process than the frontend"
    prompts = [long_prompt(1000 + i, 20) for i in range(3)]
    n_prompt = [len(r["token_ids"]) for r in patched_engine.eval(_tokenize, prompts)]
    mixed = [greedy(scale(0.5), ignore_eos=True), greedy(None, ignore_eos=True), greedy(gauss(2.0, 3), ignore_eos=True)]
    patched_engine.generate(prompts, mixed)
    [after] = patched_engine.rpc(worker_stats)
    # every token the fuzzed requests fed the model (prompt + all generated but
    # the last), and none of the neutral request's
    expected = sum(n + MAX_TOKENS - 1 for n, p in zip(n_prompt, mixed, strict=False) if p["extra_args"])
    assert after["tokens_fuzzed"] - before["tokens_fuzzed"] == expected
    assert after["buffer_ptr"] == before["buffer_ptr"], "buffers keep their address"
    [stock] = stock_engine.rpc(worker_stats)
    assert not stock["installed"]


def _tokenize(llm, prompts):
    tok = llm.get_tokenizer()
    return [{"token_ids": tok.encode(p)} for p in prompts]


def _reset_prefix_cache(llm) -> bool:
    return llm.reset_prefix_cache()


def test_cache_isolation_between_fuzz_settings(patched_engine):
    """s=0, s=1, s=0 on one long prompt: each equals an uncached run; s=1 never hits s=0's KV."""
    prompt = long_prompt(7)  # ~400 tokens: three full 128-token blocks
    runs = [None, scale(1.0), None, gauss(2.0, seed=4), scale(1.0)]
    uncached = {}
    for x in runs:
        patched_engine.eval(_reset_prefix_cache)
        uncached[repr(x)] = ids(patched_engine.generate([prompt], greedy(x)))[0]
    patched_engine.eval(_reset_prefix_cache)
    hits = []
    for x in runs:
        h0 = patched_engine.eval(metrics)["vllm:prefix_cache_hits"]
        assert ids(patched_engine.generate([prompt], greedy(x)))[0] == uncached[repr(x)], x
        hits.append(patched_engine.eval(metrics)["vllm:prefix_cache_hits"] - h0)
    assert hits[0] == 0 and hits[1] == 0, "the first s=1 run must not reuse s=0's blocks"
    assert hits[2] > 0, "the second s=0 run reuses the first one's blocks (the cache is on)"
    assert hits[3] == 0
    assert hits[4] > 0, "the second s=1 run reuses the first s=1 run's blocks"
    assert uncached[repr(None)] != uncached[repr(scale(1.0))]


def test_a_client_salt_cannot_plant_kv_under_a_fuzz_salt(patched_engine):
    """A neutral request whose cache_salt is a fuzz salt's string (public: fuzz:scale:1.0) computes
    unperturbed KV; a fuzzed request with that setting must neither hit it nor see its effect."""
    from patches.definitions.fuzz_params import parse_fuzz_args

    prompt = long_prompt(21)  # ~400 tokens: three full 128-token blocks
    fuzz = scale(1.0)
    fuzz_salt = parse_fuzz_args(fuzz).cache_salt()
    patched_engine.eval(_reset_prefix_cache)
    oracle = ids(patched_engine.generate([prompt], greedy(fuzz)))[0]  # uncached: the fuzz oracle
    patched_engine.eval(_reset_prefix_cache)
    planted = ids(patched_engine.generate([{"prompt": prompt, "cache_salt": fuzz_salt}], greedy()))[0]
    assert planted != oracle, "the planted KV is unperturbed: its output differs from the fuzzed one"
    h0 = patched_engine.eval(metrics)["vllm:prefix_cache_hits"]
    assert ids(patched_engine.generate([prompt], greedy(fuzz)))[0] == oracle
    h1 = patched_engine.eval(metrics)["vllm:prefix_cache_hits"]
    assert h1 - h0 == 0, "the fuzzed request reused KV a client planted under the fuzz salt"
    # the cache is on: the same client salt again hits its own blocks, and so does the fuzz setting
    assert ids(patched_engine.generate([{"prompt": prompt, "cache_salt": fuzz_salt}], greedy()))[0] == planted
    h2 = patched_engine.eval(metrics)["vllm:prefix_cache_hits"]
    assert h2 - h1 > 0
    assert ids(patched_engine.generate([prompt], greedy(fuzz)))[0] == oracle
    assert patched_engine.eval(metrics)["vllm:prefix_cache_hits"] - h2 > 0


@pytest.mark.parametrize(
    "xargs, field",
    [
        ({"fuzz_strength": -1}, "fuzz_strength"),
        ({"fuzz_strength": float("nan")}, "fuzz_strength"),
        ({"fuzz_strength": float("inf")}, "fuzz_strength"),
        ({"fuzz_strength": "strong"}, "fuzz_strength"),
        ({"fuzz_strength": 1, "fuzz_mode": "uniform"}, "fuzz_mode"),
        ({"fuzz_strength": 1, "fuzz_mode": "gaussian", "fuzz_seed": 1.5}, "fuzz_seed"),
        ({"fuzz_strenght": 1}, "fuzz_strenght"),
    ],
)
def test_bad_values_are_rejected_before_the_engine(patched_engine, xargs, field):
    with pytest.raises(EngineError) as ei:
        patched_engine.generate(PROMPTS[:2], greedy(xargs))
    assert ei.value.type_name == "VLLMValidationError"
    assert f"vllm_xargs.{field}" in ei.value.message
    # the engine keeps serving
    assert patched_engine.alive()
    assert len(patched_engine.generate(PROMPTS[:2], greedy(scale(0.5)))) == 2


def test_accuracy_falls_as_strength_grows(patched_engine):
    examples = held_out_examples(15)
    prompts = [ex.prompt for ex in examples]

    def generate(ps, xargs):
        assert ps == prompts
        return [(o["text"], o["token_ids"]) for o in patched_engine.generate(ps, greedy(xargs))]

    sweeps = {"scale": [0.0, 0.5, 0.8, 0.95, 1.0], "gaussian": [0.0, 0.3, 1.0, 2.15, 10.0]}
    points = run_sweep(generate, examples, sweeps)
    for mode in sweeps:
        acc = [p.accuracy for p in points if p.mode == mode]
        assert acc[0] >= 0.6, f"{mode}: the fixture task should mostly work unfuzzed ({acc})"
        assert acc[-1] <= 0.1, f"{mode}: the strongest setting should break the task ({acc})"
        assert all(b <= a + 0.1 for a, b in itertools.pairwise(acc)), f"{mode}: accuracy should fall ({acc})"
        div = [p.token_divergence for p in points if p.mode == mode]
        assert div[0] == 0 and div[-1] > 0.5
