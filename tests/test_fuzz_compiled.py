"""The fuzz patch with torch.compile on (``enforce_eager=False``).

The failure this guards against: a per-step tensor handed to a compiled model is ignored,
because the graph keeps reading what it was traced with. Here a stock engine
compiles the model first, then a patched engine starts on the *same* cache
directory: it must not reuse a stock graph (the patch adds itself to the AOT
cache key) and its fuzz must bite. (On this CPU build vLLM 0.32 never loads
an AOT artifact, docs/fuzz.md, and the project's engine environment turns
AOT compilation off, ``VLLM_USE_AOT_COMPILE=0`` in
serve_app/engine/engine_env.py: seen here, the engines trace with
``DYNAMO_TRACE_ONCE`` and the directory holds only ``modelinfos/``. So the
reuse cannot happen on CPU; tests/test_plugin.py checks the key itself.)
Both are vLLM's one-process engine (tests/conftest.py, ``ONE_PROCESS_ENV``):
the model is compiled and run the same way, one process start sooner; the
compiled path with EngineCore in its own process is the fuzz matrix's
(tests/test_fuzz_matrix.py).
"""

from __future__ import annotations

import pytest

from patches.framework.switches import ALL, OFF_ENV
from patches.fuzz import worker_stats
from testkit.engine_requests import PROMPTS, gauss, greedy, ids, scale

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def compiled_pair(start_engine, tmp_path_factory):
    cache_root = str(tmp_path_factory.mktemp("vllm-cache"))
    # The stock engine runs with the environment the plugin gives a patched one
    # (VLLM_USE_V2_MODEL_RUNNER=0), so vLLM's own cache key cannot tell them apart.
    stock = start_engine(
        {OFF_ENV: ALL, "VLLM_CACHE_ROOT": cache_root, "VLLM_USE_V2_MODEL_RUNNER": "0"},
        one_process=True,
        enforce_eager=False,
    )
    stock_out = {
        "neutral": ids(stock.generate(PROMPTS, greedy())),
        "scale1": ids(stock.generate(PROMPTS, greedy(scale(1.0)))),
    }
    stock.close()
    patched = start_engine({"VLLM_CACHE_ROOT": cache_root}, one_process=True, enforce_eager=False)
    yield stock_out, patched
    patched.close()


def test_stock_compiled_ignores_fuzz(compiled_pair):
    stock_out, _ = compiled_pair
    assert stock_out["scale1"] == stock_out["neutral"]


def test_compiled_patched_engine_fuzzes(compiled_pair):
    stock_out, patched = compiled_pair
    assert ids(patched.generate(PROMPTS, greedy())) == stock_out["neutral"]
    fuzzed = ids(patched.generate(PROMPTS, greedy(scale(1.0))))
    assert all(f != s for f, s in zip(fuzzed, stock_out["neutral"], strict=False))
    [stats] = patched.rpc(worker_stats)
    assert stats["installed"] and stats["tokens_fuzzed"] > 0


def test_compiled_mixed_batch_and_determinism(compiled_pair):
    stock_out, patched = compiled_pair
    settings = [None, scale(1.0), gauss(1.0, seed=1), scale(0.0)] * 3
    mixed = ids(patched.generate(PROMPTS, [greedy(x) for x in settings]))
    again = ids(patched.generate(PROMPTS[::-1], [greedy(x) for x in settings[::-1]]))[::-1]
    assert mixed == again
    for out, ref, x in zip(mixed, stock_out["neutral"], settings, strict=False):
        if x is None or x["fuzz_strength"] == 0:
            assert out == ref
        else:
            assert out != ref
