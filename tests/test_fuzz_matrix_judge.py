"""The fuzz matrix's pure parts: its judge, its independent noise reference, its table, its architectures' backends,
and the patch's refusal of a model whose input embedding it cannot find.

The matrix itself (real engines against the reference) is tests/test_fuzz_matrix.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from patches.definitions import fuzz_math
from patches.matrix import reference
from patches.matrix.__main__ import markdown
from patches.matrix.architectures import ARCHITECTURES, build, resolved_backend
from patches.matrix.judge import ATOL, TIE, judge
from patches.matrix.run import ArchitectureResult

TOKENS = [5, 6, 7]


def _judge(**over):
    args = dict(
        label="case",
        engine_tokens=TOKENS,
        engine_logprobs=[-1.0, -2.0, -0.5],
        reference_tokens=TOKENS,
        forced_logprobs=[-1.0, -2.0, -0.5],
        forced_best=[-1.0, -2.0, -0.5],
        repeat_tokens=TOKENS,
        cached_tokens=256,
    )
    return judge(**{**args, **over})


def test_same_tokens_and_logprobs_are_equal():
    v = _judge(engine_logprobs=[-1.0, -2.0 + ATOL / 2, -0.5])
    assert v.verdict == "equal" and v.ok


def test_same_tokens_with_other_logprobs_differ():
    # what a request served unfuzzed looks like when its greedy tokens happen to survive the perturbation
    v = _judge(engine_logprobs=[-1.0, -2.3, -0.5])
    assert v.verdict == "differs" and not v.ok
    assert v.max_dlogprob == pytest.approx(0.3)


def test_other_tokens_at_a_near_tie_are_shown_as_such():
    v = _judge(reference_tokens=[5, 9, 9], forced_best=[-1.0, -2.0 + TIE / 2, -0.5])
    assert v.verdict == "near-tie" and v.ok and not v.tokens_equal


def test_other_tokens_far_from_the_reference_differ():
    v = _judge(reference_tokens=[5, 9, 9], forced_best=[-1.0, -0.1, -0.5])
    assert v.verdict == "differs" and v.max_gap == pytest.approx(1.9)


def test_a_second_pass_from_the_cache_with_other_tokens_differs():
    v = _judge(repeat_tokens=[5, 6, 8])
    assert v.verdict == "differs" and not v.repeat_equal


def test_counts_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="tokens"):
        _judge(engine_logprobs=[-1.0])
    with pytest.raises(ValueError, match="no tokens"):
        _judge(engine_tokens=[], engine_logprobs=[], forced_logprobs=[], forced_best=[])


@pytest.mark.parametrize("seed", [0, 1, -7, 2**63 - 1, -(2**63)])
def test_reference_noise_is_the_patch_noise(seed):
    """The reference re-derives the hash noise in Python integers and float64; the patch's float32 torch code must
    give the same normals (to float32 rounding of the hash), and a wrong seed must not."""
    base = fuzz_math.seed_base(seed)
    assert base == reference.seed_base(seed)
    positions = np.arange(0, 400, 7)
    keys = fuzz_math.token_keys(np.full(len(positions), base, dtype=np.uint32), positions)
    ours = fuzz_math.gaussian_noise(torch.from_numpy(keys), fuzz_math.dim_codes(130), 130).double()
    ref = torch.tensor([reference.noise(seed, int(p), 130) for p in positions])
    assert (ours - ref).abs().max() < 1e-4
    other = torch.tensor([reference.noise(seed + 1, int(p), 130) for p in positions])
    assert (ours - other).abs().max() > 1.0


def test_reference_perturbation():
    e = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(reference.perturb(e, reference.Fuzz(0.25), 5), e.double() * 0.75)
    assert torch.equal(reference.perturb(e, reference.Fuzz(1.5), 5), e.double() * 0.0)  # clamped to 1
    g = reference.perturb(e, reference.Fuzz(0.5, "gaussian", seed=3), 5)
    rms = e.double().pow(2).mean(-1, keepdim=True).sqrt()
    z = torch.tensor([reference.noise(3, p, 8) for p in range(5)])
    assert torch.allclose(g, e.double() + 0.5 * rms * z)


def test_reference_scopes_and_ramp():
    e = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    # prompt of 3 tokens (positions 0-2), generated 3-5
    prompt = reference.perturb(e, reference.Fuzz(0.5, tokens="prompt"), 3)
    assert torch.equal(prompt[:3], e[:3].double() * 0.5) and torch.equal(prompt[3:], e[3:].double())
    generated = reference.perturb(e, reference.Fuzz(0.5, tokens="generated"), 3)
    assert torch.equal(generated[:3], e[:3].double()) and torch.equal(generated[3:], e[3:].double() * 0.5)
    ramp = reference.perturb(e, reference.Fuzz(0.0, end=1.0, ramp=2), 3)
    factors = [1.0, 1.0, 1.0, 1.0, 0.5, 0.0]  # g = 0, 1, 2: strength 0, 0.5, 1
    assert torch.equal(ramp, e.double() * torch.tensor(factors, dtype=torch.float64).unsqueeze(-1))
    step = reference.perturb(e, reference.Fuzz(0.2, end=1.0, ramp=0), 3)
    assert torch.allclose(step, e.double() * torch.tensor([0.8] * 3 + [0.0] * 3, dtype=torch.float64).unsqueeze(-1))


def test_fuzz_labels_and_xargs():
    assert reference.Fuzz().xargs() is None and reference.Fuzz().label == "none"
    assert reference.Fuzz(0.5).xargs() == {"fuzz_strength": 0.5}
    g = reference.Fuzz(1.0, "gaussian", seed=-7)
    assert g.xargs() == {"fuzz_strength": 1.0, "fuzz_mode": "gaussian", "fuzz_seed": -7}
    assert g.label == "gaussian 1 seed -7"
    deep = reference.Fuzz(0.25, "gaussian", seed=5, layer=-1, tokens="generated", end=2.0, ramp=4)
    assert deep.xargs() == {
        "fuzz_strength": 0.25,
        "fuzz_mode": "gaussian",
        "fuzz_seed": 5,
        "fuzz_layer": -1,
        "fuzz_tokens": "generated",
        "fuzz_strength_end": 2.0,
        "fuzz_ramp_tokens": 4,
    }
    assert deep.label == "gaussian 0.25->2/4 seed 5 layer -1 generated"


def test_the_reference_strength_is_the_patch_definition():
    """Two writings of one definition (the reference's, the parser's): equal at every position."""
    from patches.definitions.fuzz_params import parse_fuzz_args

    for f in (
        reference.Fuzz(0.5),
        reference.Fuzz(0.5, tokens="prompt"),
        reference.Fuzz(0.5, tokens="generated"),
        reference.Fuzz(0.25, end=2.0, ramp=4),
        reference.Fuzz(1.0, end=0.0, ramp=0, tokens="generated"),
        reference.Fuzz(0.0, end=3.0, ramp=7, tokens="all"),
    ):
        spec = parse_fuzz_args(f.xargs())
        assert [f.at(p, 10) for p in range(30)] == [spec.strength_at(p, 10) for p in range(30)], f.label


def test_a_refused_case_fails_its_row():
    from patches.matrix.judge import refusal

    r = refusal("prompt 0 scale 0.5 layer 1", "fuzz_layer is not available on this server: ...")
    assert r.verdict == "refused" and not r.ok
    row = ArchitectureResult("llama", "eager", "native", "native", cases=[_judge(), r], tokens_fuzzed=10)
    assert not row.ok and row.counts()["refused"] == 1


def test_a_row_passes_only_when_every_part_holds():
    good = ArchitectureResult("olmo2", "eager", "transformers", "transformers", cases=[_judge()], tokens_fuzzed=10)
    assert good.ok
    for bad in (
        ArchitectureResult("olmo2", "eager", "transformers", "transformers", cases=[_judge()], tokens_fuzzed=0),
        ArchitectureResult("olmo2", "eager", "native", "transformers", cases=[_judge()], tokens_fuzzed=10),
        ArchitectureResult("olmo2", "eager", "transformers", "transformers", cases=[], tokens_fuzzed=10),
        ArchitectureResult(
            "olmo2", "eager", "transformers", "transformers", cases=[_judge(cached_tokens=0)], tokens_fuzzed=10
        ),
        ArchitectureResult(
            "olmo2", "eager", "transformers", "transformers", cases=[_judge(repeat_tokens=[1])], tokens_fuzzed=10
        ),
        ArchitectureResult("olmo2", "eager", "transformers", "transformers", refused="exit 1: no"),
    ):
        assert not bad.ok, bad


def test_markdown_table_rows():
    rows = [
        ArchitectureResult("olmo2", "eager", "transformers", "transformers", cases=[_judge()], tokens_fuzzed=10),
        ArchitectureResult("gpt2", "compiled", "native", "native", refused="exit 1: FuzzSelfTestError: no"),
    ]
    table = markdown(rows, "header")
    assert "| olmo2 | transformers | eager | 1 | 1 | 0 | 0 |" in table and "| pass |" in table
    assert "refused: exit 1: FuzzSelfTestError: no" in table


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_vllm_runs_each_architecture_where_the_matrix_says(name):
    assert resolved_backend(build(name)) == ARCHITECTURES[name].backend


class _NoEmbedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(10, 4))

    def embed_input_ids(self, ids):
        return torch.nn.functional.embedding(ids, self.table)


class _TwoEmbeddings(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Embedding(10, 4)
        self.b = torch.nn.Embedding(10, 4)

    def embed_input_ids(self, ids):
        return self.a(ids) + self.b(ids)


@pytest.mark.parametrize("model", [_NoEmbedding(), _TwoEmbeddings()], ids=["none", "two"])
def test_an_embedding_that_cannot_be_found_is_refused_naming_the_switch(model):
    from patches.fuzz import find_input_embedding

    with pytest.raises(RuntimeError, match="FUZZSERVE_PATCHES_OFF=fuzz"):
        find_input_embedding(model, torch.device("cpu"))


class _ProbeFails(torch.nn.Module):
    """A model whose embedding lookup raises (a shape or device the patch did not foresee)."""

    def __init__(self):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(10, 4)

    def embed_input_ids(self, ids):
        raise IndexError("no such row")


def test_a_failed_probe_on_the_first_rank_is_refused_not_served_unfuzzed():
    """Before: any exception of the probe read as "no embedding on this rank", the self-test was skipped for a
    rank without fuzz state, and every fuzz request of a single-process engine would have been answered unfuzzed."""
    from patches.fuzz import find_input_embedding

    with pytest.raises(RuntimeError, match="FUZZSERVE_PATCHES_OFF=fuzz") as caught:
        find_input_embedding(_ProbeFails(), torch.device("cpu"))
    assert isinstance(caught.value.__cause__, IndexError), "the model's own error is kept as the cause"


def test_a_failed_probe_on_a_later_pipeline_rank_means_no_embedding_there(monkeypatch):
    from patches import fuzz

    monkeypatch.setattr(fuzz, "_first_pipeline_rank", lambda: False)
    assert fuzz.find_input_embedding(_ProbeFails(), torch.device("cpu")) is None


def test_one_embedding_is_found():
    from patches.fuzz import find_input_embedding

    class One(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(10, 4)

        def embed_input_ids(self, ids):
            return self.embed_tokens(ids)

    found = find_input_embedding(One(), torch.device("cpu"))
    assert found is not None
    name, module = found
    assert name == "embed_tokens" and isinstance(module, torch.nn.Embedding)


def test_float_noise_is_judged_against_the_float64_reference():
    """Beyond ATOL of the float32 reference with its tokens: float-noise only when the engine is within ATOL plus
    the float32 reference's own distance from the float64 one; a real disagreement stays differs."""
    from patches.matrix.judge import rejudge

    engine = [-1.0, -2.0, -0.5]
    forced32 = [-1.0, -2.0 + 3 * ATOL, -0.5]  # the float32 reference, 3 ATOL off the engine
    v = _judge(engine_logprobs=engine, forced_logprobs=forced32)
    assert v.verdict == "differs" and v.float_noise_candidate
    forced64 = [-1.0, -2.0 + 1.9 * ATOL, -0.5]  # float32 reference 1.1 ATOL from float64; engine 1.9 ATOL from it
    r = rejudge(v, engine, forced32, forced64)
    assert r.verdict == "float-noise" and r.ok and r.float_floor == pytest.approx(1.1 * ATOL)
    assert r.dlogprob64 == pytest.approx(1.9 * ATOL)
    far64 = [-1.0, -2.0 + 2.5 * ATOL, -0.5]  # the float32 reference 0.5 ATOL from float64, the engine 2.5 from it
    r = rejudge(v, engine, forced32, far64)
    assert r.verdict == "differs" and not r.ok and r.dlogprob64 == pytest.approx(2.5 * ATOL)
    # other tokens, or a second pass that disagrees, never become float-noise
    other = _judge(engine_logprobs=engine, forced_logprobs=forced32, repeat_tokens=[9, 9, 9])
    assert not other.float_noise_candidate and rejudge(other, engine, forced32, forced64) is other
