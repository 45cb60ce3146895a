"""The ``fuzz_layer`` patch at torch level (no engine): the class swap, the op, its three paths, the layer search.

A stand-in model with both shapes of decoder layer vLLM 0.32 runs: layers
that return ``(hidden, residual)`` with the residual add deferred to the next
layer's norm (vLLM's own model files) and layers that return the stream
itself (Hugging Face's, on vLLM's Transformers backend, in ``[1, n, hidden]``).
Checked against the definition written out here: the stream ``x`` of a token
aimed at point ``k`` leaves layer ``k`` as ``x * mult + std * rms(x) * z``,
every other token bit for bit unchanged; the same in eager mode, under
torch.compile (where the op decides at run time, so one compiled graph serves
neutral and fuzzed steps), and on the branch-free path a CUDA graph capture
takes (forced here on the CPU).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from patches import fuzz, fuzz_layer
from patches.definitions import fuzz_math as fm

H = 64
N = 12
MAX_TOKENS = 32


class _Buf:  # what CPUModelRunner._make_buffer gives: .gpu aliases .cpu
    def __init__(self, n, dtype):
        self.cpu = torch.zeros(n, dtype=dtype)
        self.gpu = self.cpu
        self.np = self.cpu.numpy()

    def copy_to_gpu(self, n):
        pass


class PairLayer(torch.nn.Module):
    """vLLM's shape: returns (hidden, residual); the stream is their sum, added by the next layer's norm."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(H, H)

    def forward(self, hidden, residual):
        residual = hidden if residual is None else hidden + residual
        return self.lin(torch.nn.functional.rms_norm(residual, (H,))), residual


class StreamLayer(torch.nn.Module):
    """Hugging Face's shape on vLLM's Transformers backend: [1, n, hidden] in, the stream out."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(H, H)

    def forward(self, x):
        return x + self.lin(torch.nn.functional.rms_norm(x, (H,)))


class PairModel(torch.nn.Module):
    def __init__(self, n_layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList([PairLayer() for _ in range(n_layers)])

    def forward(self, x):
        hidden, residual = x, None
        for layer in self.layers:
            hidden, residual = layer(hidden, residual)
        return hidden + residual


class StreamModel(torch.nn.Module):
    def __init__(self, n_layers=3):
        super().__init__()
        self.layers = torch.nn.ModuleList([StreamLayer() for _ in range(n_layers)])

    def forward(self, x):
        x = x[None]
        for layer in self.layers:
            x = layer(x)
        return x[0]


def _hooked(model_cls):
    torch.manual_seed(0)
    model = model_cls()
    plain = model_cls()
    plain.load_state_dict(model.state_dict())
    runner = types.SimpleNamespace(
        max_num_tokens=MAX_TOKENS, device=torch.device("cpu"), _make_buffer=lambda n, dtype: _Buf(n, dtype)
    )
    embedding = types.SimpleNamespace(key=_Buf(MAX_TOKENS, torch.int64), codes=fm.dim_codes(H))
    fuzz_layer._register_ops()
    state = fuzz_layer._LayerState(runner, embedding, len(model.layers))
    state.hook("layers", model.layers)
    state.reason = None
    return model, plain, state, embedding


def _expected(plain, x, point, mult, std, keys):
    """The definition, on the unhooked model: each token's stream scaled and noised after its layer."""
    rows = np.flatnonzero(point)

    def perturb_after(k, stream):
        sel = [i for i in rows if point[i] == k]
        if not sel:
            return stream
        s = stream.clone()
        xs = stream[sel].to(torch.float32)
        rms = xs.pow(2).mean(-1, keepdim=True).sqrt()
        z = fm.gaussian_noise(torch.tensor(keys[sel]), fm.dim_codes(H), H)
        s[sel] = xs * torch.tensor(mult[sel]).unsqueeze(-1) + torch.tensor(std[sel]).unsqueeze(-1) * rms * z
        return s

    if isinstance(plain, PairModel):
        hidden, residual = x, None
        for k, layer in enumerate(plain.layers, start=1):
            hidden, residual = layer(hidden, residual)
            stream = perturb_after(k, hidden + residual)
            hidden, residual = stream, torch.zeros_like(stream)
        return hidden + residual
    s = x
    for k, layer in enumerate(plain.layers, start=1):
        s = perturb_after(k, layer(s[None])[0])
    return s


def _step(state, embedding, point, mult, std, keys):
    embedding.key.np[: len(keys)] = keys
    state.fill(len(point), point, mult, std)


CASE = {
    "point": np.array([0, 1, 0, 3, 2, 1, 0, 0, 3, 3, 0, 2]),
    "mult": np.array([1, 0.5, 1, 1, 0.25, 1, 1, 1, 0.0, 1, 1, 1], dtype=np.float32),
    "std": np.array([0, 0, 0, 2.0, 0, 1.5, 0, 0, 0, 0.5, 0, 0.75], dtype=np.float32),
    "keys": np.arange(N, dtype=np.int64) * 7919 + 11,
}


@pytest.mark.parametrize("model_cls", [PairModel, StreamModel])
def test_only_the_rows_aimed_at_a_layer_change_as_defined(model_cls):
    model, plain, state, embedding = _hooked(model_cls)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _step(state, embedding, **CASE)
        got = model(x)
        want = _expected(plain, x, **CASE)
        untouched = CASE["point"] == 0
        assert torch.equal(got[untouched], plain(x)[untouched])  # bit for bit, in a batch with fuzzed tokens
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(got[~untouched], plain(x)[~untouched])
        state.clear()
        assert torch.equal(model(x), plain(x))  # neutral step: exactly stock


@pytest.mark.parametrize("model_cls", [PairModel, StreamModel])
def test_the_capture_path_computes_what_the_eager_path_does(model_cls, monkeypatch):
    """A CUDA graph capture runs the branch-free arithmetic over every row, chosen by the buffers; forced here."""
    model, _plain, state, embedding = _hooked(model_cls)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _step(state, embedding, **CASE)
        eager = model(x)
        monkeypatch.setattr(fuzz_layer, "_capturing", lambda t: True)
        monkeypatch.setattr(fuzz, "_running_eagerly", lambda t: False)
        captured = model(x)
        state.rows = {}  # a replay reads the buffers only, whatever Python decided
        assert torch.equal(model(x), captured)
    assert torch.allclose(captured, eager, atol=1e-6)
    untouched = CASE["point"] == 0
    assert torch.equal(captured[untouched], eager[untouched])


@pytest.mark.parametrize("model_cls", [PairModel, StreamModel])
def test_one_compiled_graph_serves_neutral_and_fuzzed_steps(model_cls):
    model, _plain, state, embedding = _hooked(model_cls)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        state.clear()
        eager_neutral = model(x)
        _step(state, embedding, **CASE)
        eager_fuzzed = model(x)
        state.clear()
        compiled = torch.compile(model, dynamic=True, fullgraph=True)  # the op is opaque: no graph break
        assert torch.allclose(compiled(x), eager_neutral, atol=1e-5)
        _step(state, embedding, **CASE)
        assert torch.allclose(compiled(x), eager_fuzzed, atol=1e-5)
        other = dict(CASE, point=np.roll(CASE["point"], 1))
        _step(state, embedding, **other)
        eager_other = None
        state.tracing = True  # the eager run below must call the op even where nothing is aimed (self-test mode)
        state.trace = []
        compiled(x)
        assert state.trace == [1, 2, 3]  # the compiled graph calls the op once per layer, in depth order
        state.tracing = False
        eager_other = model(x)
        assert torch.allclose(compiled(x), eager_other, atol=1e-5)


def test_the_layer_search():
    model = PairModel(4)
    found = fuzz_layer.find_decoder_layers(model, 4)
    assert not isinstance(found, str) and found == ("layers", model.layers)
    assert "no single list of 3" in str(fuzz_layer.find_decoder_layers(model, 3))
    assert "states no decoder layers" in str(fuzz_layer.find_decoder_layers(model, 0))

    class TwoStacks(torch.nn.Module):  # a vision tower as deep as the language model
        def __init__(self):
            super().__init__()
            self.vision = PairModel(4)
            self.text = StreamModel(4)

        def get_language_model(self):
            return self.text

    two = TwoStacks()
    found = fuzz_layer.find_decoder_layers(two, 4)
    assert not isinstance(found, str) and found[1] is two.text.layers
    two.get_language_model = lambda: two  # type: ignore[method-assign]
    assert "candidates: vision.layers, text.layers" in str(fuzz_layer.find_decoder_layers(two, 4))

    mixed = PairModel(4)
    mixed.layers[2] = StreamLayer()  # entries of two classes: not one stack
    assert "none found" in str(fuzz_layer.find_decoder_layers(mixed, 4))


def test_the_report_combines_every_worker():
    assert fuzz_layer.combine([{"layers": 4, "reason": None}, {"layers": 4, "reason": None}]).reason is None
    r = fuzz_layer.combine([{"layers": 4, "reason": None}, {"layers": 4, "reason": "rank 1 failed"}])
    assert r.layers == 4 and r.reason == "rank 1 failed"
    assert fuzz_layer.combine([]).reason
