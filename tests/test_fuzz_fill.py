"""The worker's per-step buffer fill (``_RunnerFuzzState.fill``), against a per-token reference.

No engine: a stand-in runner with the attributes ``fill`` reads (the input
batch's request ids in row order, their computed-token counts, the requests'
sampling params and prompt lengths, the model's layer count). The fill caches
per-batch values and only recomputes them when the batch changes, so the
property drives sequences of steps where requests join, leave, swap rows and
stay put, and checks every step's buffers (the embedding's and the decoder
layers', ``patches.fuzz_layer``) against values computed token by token from
the definition (``FuzzSpec.strength_at``, ``resolve_layer``).
"""

from __future__ import annotations

import types

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from patches import fuzz, fuzz_layer
from patches.definitions import fuzz_math as fm
from patches.definitions.fuzz_params import parse_or_neutral, resolve_layer

H = 64
MAX_TOKENS = 256
MAX_REQS = 8
LAYERS = 4


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
        model_config=types.SimpleNamespace(get_total_num_hidden_layers=lambda: LAYERS),
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
    st.builds(
        lambda s, layer, tokens: {"fuzz_strength": s, "fuzz_layer": layer, "fuzz_tokens": tokens},
        st.sampled_from([0.0, 0.5, 1.0]),
        st.sampled_from([0, 1, 2, 4, -1, -5, 7]),  # 7 and -6 are out of range: served unperturbed
        st.sampled_from(["all", "prompt", "generated"]),
    ),
    st.builds(
        lambda s0, s1, ramp, layer, gauss: {
            "fuzz_strength": s0,
            "fuzz_strength_end": s1,
            "fuzz_ramp_tokens": ramp,
            "fuzz_layer": layer,
            "fuzz_mode": "gaussian" if gauss else "scale",
            "fuzz_seed": 3,
        },
        st.sampled_from([0.0, 0.25, 2.0]),
        st.sampled_from([0.0, 1.0, 3.0]),
        st.integers(0, 6),
        st.sampled_from([0, 2, -1]),
        st.booleans(),
    ),
)

# One step: which of the live requests are in the batch (in which order), and tokens per request.
STEP = st.tuples(
    st.permutations(range(MAX_REQS)),
    st.integers(0, MAX_REQS),
    st.lists(st.integers(1, 24), min_size=MAX_REQS, max_size=MAX_REQS),
    # where each request's computed tokens stand, from the end of its prompt: a step's tokens straddle the prompt's
    # end, or sit in the ramp, often enough for the scopes and ramps to matter
    st.lists(st.integers(-30, 40), min_size=MAX_REQS, max_size=MAX_REQS),
)


@settings(max_examples=120, deadline=None)
@given(
    xargs=st.lists(XARGS, min_size=MAX_REQS, max_size=MAX_REQS),
    prompts=st.lists(st.integers(1, 600), min_size=MAX_REQS, max_size=MAX_REQS),
    steps=st.lists(STEP, min_size=1, max_size=8),
)
def test_fill_matches_a_per_token_reference(xargs, prompts, steps):
    runner = _runner()
    for i, (xa, prompt_len) in enumerate(zip(xargs, prompts, strict=True)):
        runner.requests[f"r{i}"] = types.SimpleNamespace(
            sampling_params=types.SimpleNamespace(extra_args=xa), num_prompt_tokens=prompt_len
        )
    emb = torch.nn.Embedding(10, H)
    state = fuzz._RunnerFuzzState(runner, "emb", emb, H)
    layers = fuzz_layer._LayerState(runner, state, LAYERS)
    layers.reason = None
    state.layers = layers
    previous_total = 0
    for order, n, counts, offsets in steps:
        n = max(1, n)
        ids = [f"r{i}" for i in order[:n]]
        batch = runner.input_batch
        batch.num_reqs, batch.req_ids = n, [*ids, "stale"]  # rows past num_reqs must be ignored
        computed = [
            max(0, runner.requests[rid].num_prompt_tokens + off) for rid, off in zip(ids, offsets, strict=False)
        ]
        batch.num_computed_tokens_cpu[:n] = computed[:n]
        sched = np.array([*counts[:n], 99], dtype=np.int32)
        state.fill(runner, sched)

        mult, std, key, point = [], [], [], []  # per token: the values at its point, and the point (-1: nowhere)
        for rid, c, done in zip(ids, counts, computed, strict=False):
            spec, _ = parse_or_neutral(runner.requests[rid].sampling_params.extra_args)
            at = resolve_layer(spec.layer, LAYERS)
            base = fm.seed_base(spec.seed) if spec.mode == "gaussian" and not spec.is_neutral else 0
            for p in range(done, done + c):
                s = spec.strength_at(p, runner.requests[rid].num_prompt_tokens) if at is not None else 0.0
                mult.append(np.float32(1.0 - min(s, 1.0)) if spec.mode == "scale" else np.float32(1.0))
                std.append(np.float32(s) if spec.mode == "gaussian" else np.float32(0.0))
                key.append(int(fm.token_keys(np.array([base], dtype=np.uint64), np.array([p]))[0]))
                point.append(at if at is not None and s else -1)
        total = len(mult)
        at_emb = [i for i, a in enumerate(point) if a == 0]
        at_layers = {a: [i for i, b in enumerate(point) if b == a] for a in set(point) if a > 0}
        assert emb.fuzz_active == bool(at_emb)
        assert {a: r.tolist() for a, r in layers.rows.items()} == at_layers
        if any(a >= 0 for a in point):
            expect_mult = [m if a == 0 else 1.0 for m, a in zip(mult, point, strict=True)]
            expect_std = [s if a == 0 else 0.0 for s, a in zip(std, point, strict=True)]
            assert np.array_equal(state.mult.np[:total], np.array(expect_mult, dtype=np.float32))
            assert np.array_equal(state.std.np[:total], np.array(expect_std, dtype=np.float32))
            noisy = [i for i, s in enumerate(std) if s]
            assert np.array_equal(state.key.np[noisy], np.array(key, dtype=np.int64)[noisy])
            for a, rows in at_layers.items():
                assert np.array_equal(layers.mult.np[rows], np.array(mult, dtype=np.float32)[rows])
                assert np.array_equal(layers.std.np[rows], np.array(std, dtype=np.float32)[rows])
                assert (layers.point.np[rows] == a).all()
            emb_noise = [i for i in noisy if point[i] == 0]
            if emb.fuzz_active and len(emb_noise) < total:
                noise_rows = emb.fuzz_noise_rows
                assert isinstance(noise_rows, torch.Tensor) and noise_rows.tolist() == emb_noise
        # tokens not aimed at a layer read point 0 (none) in the layers' buffer, past this step's tokens too
        upto = max(total, previous_total)
        aimed = [i for i, a in enumerate(point) if a > 0]
        assert (np.delete(layers.point.np[:upto], aimed) == 0).all()
        # whatever an earlier step left past this step's tokens is neutral again
        assert (state.mult.np[total:upto] == 1.0).all() and (state.std.np[total:upto] == 0.0).all()
        if not at_emb:
            assert (state.mult.np[:upto] == 1.0).all() and (state.std.np[:upto] == 0.0).all()
        previous_total = total


def test_fill_recomputes_request_values_only_when_the_batch_changes():
    runner = _runner()
    for i in range(3):
        runner.requests[f"r{i}"] = types.SimpleNamespace(
            sampling_params=types.SimpleNamespace(extra_args={"fuzz_strength": 0.5}), num_prompt_tokens=4
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
