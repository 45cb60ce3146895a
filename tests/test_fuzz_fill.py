"""The worker's per-step buffer fill (``_RunnerFuzzState.fill``), against a per-token reference.

No engine: a stand-in runner with the attributes ``fill`` reads (the input
batch's request ids in row order, their computed-token counts, the requests'
sampling params). The fill caches per-batch values and only recomputes them
when the batch changes, so the property drives sequences of steps where
requests join, leave, swap rows and stay put, and checks every step's
buffers against values computed token by token from the request specs.
"""

from __future__ import annotations

import types

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from patches import fuzz
from patches import fuzz_math as fm
from patches.fuzz_params import parse_or_neutral

H = 64
MAX_TOKENS = 256
MAX_REQS = 8


class _Buf:  # what CPUModelRunner._make_buffer gives: .gpu aliases .cpu
    def __init__(self, n, dtype):
        self.cpu = torch.zeros(n, dtype=dtype)
        self.gpu = self.cpu
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n):
        pass


def _runner():
    r = types.SimpleNamespace(
        max_num_tokens=MAX_TOKENS,
        max_num_reqs=MAX_REQS,
        device=torch.device("cpu"),
        _make_buffer=lambda n, dtype: _Buf(n, dtype),
        requests={},
    )
    r.input_batch = types.SimpleNamespace(
        num_reqs=0, req_ids=[], num_computed_tokens_cpu=np.zeros(MAX_REQS, dtype=np.int32)
    )
    return r


XARGS = st.one_of(
    st.none(),
    st.just({"fuzz_strength": 0.0}),
    st.builds(lambda s: {"fuzz_strength": s}, st.sampled_from([0.25, 1.0, 3.0])),
    st.builds(
        lambda s, seed: {"fuzz_strength": s, "fuzz_mode": "gaussian", "fuzz_seed": seed},
        st.sampled_from([1e-4, 0.5, 2.0]),
        st.integers(-(2**63), 2**63 - 1),
    ),
    st.just({"fuzz_strength": "bad"}),  # invalid: served neutral, never an error in the worker
)

# One step: which of the live requests are in the batch (in which order), and tokens per request.
STEP = st.tuples(
    st.permutations(range(MAX_REQS)),
    st.integers(0, MAX_REQS),
    st.lists(st.integers(1, 24), min_size=MAX_REQS, max_size=MAX_REQS),
    st.lists(st.integers(0, 900), min_size=MAX_REQS, max_size=MAX_REQS),
)


@settings(max_examples=60, deadline=None)
@given(xargs=st.lists(XARGS, min_size=MAX_REQS, max_size=MAX_REQS), steps=st.lists(STEP, min_size=1, max_size=8))
def test_fill_matches_a_per_token_reference(xargs, steps):
    runner = _runner()
    for i, xa in enumerate(xargs):
        runner.requests[f"r{i}"] = types.SimpleNamespace(sampling_params=types.SimpleNamespace(extra_args=xa))
    emb = torch.nn.Embedding(10, H)
    state = fuzz._RunnerFuzzState(runner, "emb", emb, H)
    previous_total = 0
    for order, n, counts, computed in steps:
        n = max(1, n)
        ids = [f"r{i}" for i in order[:n]]
        batch = runner.input_batch
        batch.num_reqs, batch.req_ids = n, [*ids, "stale"]  # rows past num_reqs must be ignored
        batch.num_computed_tokens_cpu[:n] = computed[:n]
        sched = np.array([*counts[:n], 99], dtype=np.int32)
        state.fill(runner, sched)

        mult, std, key = [], [], []
        for rid, c, done in zip(ids, counts, computed, strict=False):
            spec, _ = parse_or_neutral(runner.requests[rid].sampling_params.extra_args)
            base = fm.seed_base(spec.seed) if spec.noise_std else 0
            for p in range(done, done + c):
                mult.append(spec.scale_multiplier)
                std.append(spec.noise_std)
                key.append(int(fm.token_keys(np.array([base], dtype=np.uint64), np.array([p]))[0]))
        total = len(mult)
        fuzzed = any(m != 1.0 or s != 0.0 for m, s in zip(mult, std, strict=False))
        assert emb.fuzz_active == fuzzed
        if fuzzed:
            assert np.array_equal(state.mult.np[:total], np.array(mult, dtype=np.float32))
            assert np.array_equal(state.std.np[:total], np.array(std, dtype=np.float32))
            assert np.array_equal(state.key.np[:total], np.array(key, dtype=np.int64))
            noisy = [i for i, s in enumerate(std) if s]
            if len(noisy) < total:
                rows = emb.fuzz_noise_rows
                assert isinstance(rows, torch.Tensor) and rows.tolist() == noisy
            else:
                assert emb.fuzz_noise_rows is None
        # whatever an earlier step left past this step's tokens is neutral again
        upto = max(total, previous_total)
        assert (state.mult.np[total:upto] == 1.0).all() and (state.std.np[total:upto] == 0.0).all()
        if not fuzzed:
            assert (state.mult.np[:upto] == 1.0).all() and (state.std.np[:upto] == 0.0).all()
        previous_total = total


def test_fill_recomputes_request_values_only_when_the_batch_changes():
    runner = _runner()
    for i in range(3):
        runner.requests[f"r{i}"] = types.SimpleNamespace(
            sampling_params=types.SimpleNamespace(extra_args={"fuzz_strength": 0.5})
        )
    state = fuzz._RunnerFuzzState(runner, "emb", torch.nn.Embedding(10, H), H)
    batch = runner.input_batch
    batch.num_reqs, batch.req_ids = 2, ["r0", "r1"]
    ones = np.ones(3, dtype=np.int32)
    state.fill(runner, ones)
    first = state.rows
    batch.num_computed_tokens_cpu[:2] += 1
    state.fill(runner, ones)
    assert state.rows is first  # same requests, same rows: reused
    batch.req_ids = ["r1", "r0"]
    state.fill(runner, ones)
    assert state.rows is not first and state.rows is not None and state.rows.req_ids == ["r1", "r0"]
