"""The fuzz patch's eager fast path (torch level, no engine).

In eager mode a step with no perturbed token skips the arithmetic; while
Dynamo traces, the graph always gets the arithmetic, so a compiled model keeps
reading the buffers whatever the flag said at trace time. Both directions are
checked by making the flag *disagree* with the buffers: then the output shows
which path ran.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from patches import fuzz
from patches.definitions import fuzz_math as fm

H = 64

if TYPE_CHECKING:

    class FuzzedEmbedding(torch.nn.Embedding):
        """What _fuzzed_embedding returns, as mypy sees it: the buffers and plain attributes patches.fuzz gives the
        input embedding (torch types Module.__setattr__ for tensors and modules only, but sets any value)."""

        fuzz_mult: torch.Tensor
        fuzz_std: torch.Tensor
        fuzz_key: torch.Tensor
        fuzz_codes: torch.Tensor
        fuzz_active: bool
        fuzz_noise_rows: torch.Tensor | None


def _fuzzed_embedding(n: int = 32) -> FuzzedEmbedding:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, H)
    emb.register_buffer("fuzz_mult", torch.ones(n), persistent=False)
    emb.register_buffer("fuzz_std", torch.ones(n), persistent=False)  # non-neutral: would perturb every token
    emb.register_buffer("fuzz_key", torch.arange(n, dtype=torch.int64) * 7919, persistent=False)
    emb.register_buffer("fuzz_codes", fm.dim_codes(H), persistent=False)
    fuzzed = cast("FuzzedEmbedding", emb)
    fuzzed.fuzz_active = False
    fuzzed.fuzz_noise_rows = None
    emb.__class__ = fuzz._fuzzed_class(type(emb))
    return fuzzed


def test_eager_step_without_fuzz_skips_the_arithmetic():
    emb = _fuzzed_embedding()
    ids = torch.arange(16)
    with torch.no_grad():
        base = torch.nn.functional.embedding(ids, emb.weight)
        assert torch.equal(emb(ids), base)  # flag off: the buffers are not read
        emb.fuzz_active = True
        assert not torch.allclose(emb(ids), base)  # flag on: they are


def test_traced_graph_ignores_the_flag():
    emb = _fuzzed_embedding()
    ids = torch.arange(16)
    compiled = torch.compile(emb, fullgraph=True, dynamic=True)
    with torch.no_grad():
        base = torch.nn.functional.embedding(ids, emb.weight)
        out = compiled(ids)  # traced while the flag says "nothing fuzzed"
        assert not torch.allclose(out, base)
        emb.fuzz_active = True
        assert torch.allclose(out, emb(ids), atol=1e-5)


def test_eager_noise_only_on_the_listed_rows_matches_the_full_arithmetic():
    emb = _fuzzed_embedding()
    ids = torch.arange(16)
    with torch.no_grad():
        emb.fuzz_std[:] = 0.0
        emb.fuzz_std[[2, 5, 11]] = torch.tensor([0.5, 3.0, 1.0])  # gaussian tokens
        emb.fuzz_mult[[0, 1]] = torch.tensor([0.5, 0.0])  # scale tokens
        emb.fuzz_active = True
        full = emb(ids)  # no row list: the full arithmetic
        emb.fuzz_noise_rows = torch.tensor([2, 5, 11])
        assert torch.equal(emb(ids), full)
        emb.fuzz_noise_rows = torch.tensor([2, 5])  # a wrong list shows: row 11 loses its noise
        assert not torch.equal(emb(ids)[11], full[11])
