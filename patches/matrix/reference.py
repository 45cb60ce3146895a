"""An independent reference of fuzz: the Hugging Face model, perturbed by code that shares nothing with the patch.

What fuzz promises (docs/fuzz.md): the token at absolute position ``p`` of a
request whose prompt has ``P`` tokens gets a strength ``s(p)``: 0 outside its
scope (``fuzz_tokens``: prompt tokens are ``p < P``, generated ones
``p >= P``), ``fuzz_strength`` for a prompt token or without a ramp, and
``fuzz_strength + (fuzz_strength_end - fuzz_strength) * min((p - P) / R, 1)``
for a generated token under a ramp of ``R`` tokens (``R = 0``: the end
strength at once). At the point ``fuzz_layer`` names (0: the output of the
model's input-embedding module; ``k``: the residual stream the model's
decoder layer ``k`` outputs, 1-based; negative from the end) that token's
vector ``x`` becomes ``x * (1 - clamp(s, 0, 1))`` in scale mode and
``x + s * rms(x) * z`` in gaussian mode, ``z`` standard normal noise that
depends only on the request's seed and ``p``. Whatever the model does after
that point it then does to the perturbed vector.

This module computes that with transformers' own model: at point 0 through
its ``inputs_embeds`` argument, deeper through a forward hook on the decoder
layer (found by the path the matrix writes down per family, never searched
for), and re-derives the noise from the hash's definition in plain Python
integers and float64 (:func:`noise`), not from :mod:`patches.definitions.fuzz_math`'s
numpy and torch code, nor the strength from :mod:`patches.definitions.fuzz_params`. A bug
in the patch's arithmetic, its buffers, its schedule or where it hooks the
model therefore shows up as a disagreement, and the noise's
float32-versus-float64 difference (below 1e-6 of a vector's scale) is far
below what the judge tolerates. ``layer_offset`` moves the reference's point
(the matrix's planted off-by-one control: every layer case must then fail).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

M32 = 0xFFFFFFFF
_C1 = 0x7FEB352D
_C2 = 0x2C1B3C6D
_GOLDEN = 0x9E3779B9
_DIM_MULT = 2654435761
_DIM_ADD = 12345


def _mix(x: int) -> int:
    """The patch's 32-bit integer hash, from its definition (xorshift-multiply), in Python integers."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    x ^= x >> 16
    return x


def seed_base(seed: int) -> int:
    """A request's 32-bit noise base from its signed 64-bit ``fuzz_seed``."""
    u = seed & 0xFFFFFFFFFFFFFFFF
    return _mix((u & M32) ^ _mix(u >> 32))


def token_key(base: int, position: int) -> int:
    """The key of the token at absolute ``position`` of a request with noise base ``base``."""
    return _mix(base ^ _mix(position + _GOLDEN))


def noise(seed: int, position: int, hidden: int) -> list[float]:
    """Standard normal noise of one token (``hidden`` values, float64), by Box-Muller on hashed codes.

    Dimension pair ``j`` hashes the token's key with two fixed codes; the
    first code gives the radius, the second the angle; dimension ``j`` takes
    the cosine normal and dimension ``pairs + j`` the sine one.
    """
    pairs = (hidden + 1) // 2
    codes = [_mix(_mix((i * _DIM_MULT + _DIM_ADD) & M32)) for i in range(2 * pairs)]
    key = token_key(seed_base(seed), position)
    cos_half, sin_half = [], []
    for j in range(pairs):
        u1 = (_mix(key ^ codes[j]) + 1) / 4294967297.0
        theta = 2.0 * math.pi * _mix(key ^ codes[pairs + j]) / 4294967297.0
        r = math.sqrt(-2.0 * math.log(u1))
        cos_half.append(r * math.cos(theta))
        sin_half.append(r * math.sin(theta))
    return (cos_half + sin_half)[:hidden]


@dataclass(frozen=True)
class Fuzz:
    """One request's fuzz setting, as the client sends it in ``vllm_xargs`` (None: no fuzz keys at all)."""

    strength: float | None = None
    mode: str = "scale"
    seed: int = 0
    layer: int = 0
    tokens: str = "all"
    end: float | None = None  # fuzz_strength_end: a ramp
    ramp: int = 0  # fuzz_ramp_tokens

    def xargs(self) -> dict[str, Any] | None:
        if self.strength is None:
            return None
        out: dict[str, Any] = {"fuzz_strength": self.strength}
        if self.mode != "scale":
            out |= {"fuzz_mode": self.mode, "fuzz_seed": self.seed}
        if self.layer:
            out["fuzz_layer"] = self.layer
        if self.tokens != "all":
            out["fuzz_tokens"] = self.tokens
        if self.end is not None:
            out |= {"fuzz_strength_end": self.end, "fuzz_ramp_tokens": self.ramp}
        return out

    @property
    def label(self) -> str:
        if self.strength is None:
            return "none"
        text = f"{self.mode} {self.strength:g}"
        if self.end is not None:
            text += f"->{self.end:g}/{self.ramp}"
        if self.mode == "gaussian":
            text += f" seed {self.seed}"
        if self.layer:
            text += f" layer {self.layer}"
        if self.tokens != "all":
            text += f" {self.tokens}"
        return text

    @property
    def neutral(self) -> bool:
        return not self.strength and not self.end

    def at(self, position: int, prompt_len: int) -> float:
        """The strength of the token at ``position`` (docs/fuzz.md's definition, written out again here)."""
        generated = position >= prompt_len
        if self.strength is None or (self.tokens == "prompt" and generated):
            return 0.0
        if self.tokens == "generated" and not generated:
            return 0.0
        if not generated or self.end is None:
            return self.strength
        if self.ramp == 0:
            return self.end
        return self.strength + (self.end - self.strength) * min((position - prompt_len) / self.ramp, 1.0)


@functools.lru_cache(maxsize=65536)
def _noise_row(seed: int, position: int, hidden: int) -> tuple[float, ...]:
    return tuple(noise(seed, position, hidden))


def perturb(vectors: Any, fuzz: Fuzz, prompt_len: int) -> Any:
    """``vectors`` [n, hidden] (positions 0..n-1 of one request) perturbed as ``fuzz`` says, in float64."""
    import torch

    x = vectors.to(torch.float64)
    n, hidden = x.shape
    s = torch.tensor([fuzz.at(p, prompt_len) for p in range(n)], dtype=torch.float64).unsqueeze(-1)
    if fuzz.mode == "scale":
        return x * (1.0 - s.clamp(0.0, 1.0))
    z = torch.tensor([_noise_row(fuzz.seed, p, hidden) for p in range(n)], dtype=torch.float64)
    rms = torch.sqrt(torch.mean(vectors.to(torch.float32).to(torch.float64) ** 2, dim=-1, keepdim=True))
    return x + s * rms * z


class Reference:
    """A transformers model perturbed as a request's fuzz says: greedy continuations and per-position log-probs."""

    def __init__(self, model_path: str, layers_path: str = "model.layers", layer_offset: int = 0, double: bool = False):
        """``double``: the model in float64 (the exact answer float32 implementations are measured against)."""
        import torch
        import transformers

        # the class the checkpoint names (a multimodal model's text path is what the matrix compares)
        config = transformers.AutoConfig.from_pretrained(model_path)
        model_class = getattr(transformers, config.architectures[0])
        torch.manual_seed(0)
        dtype = torch.float64 if double else torch.float32
        self.model = model_class.from_pretrained(model_path, dtype=dtype, attn_implementation="eager")
        self.model.eval()
        self.layers = operator.attrgetter(layers_path)(self.model)
        self.layer_offset = layer_offset

    def point(self, fuzz: Fuzz) -> int:
        """Where the reference perturbs: 0 (the embeddings) or k (after decoder layer k, 1-based)."""
        n = len(self.layers)
        k = fuzz.layer if fuzz.layer >= 0 else n + 1 + fuzz.layer
        return 0 if k == 0 else min(max(k + self.layer_offset, 0), n)

    def logprobs(self, ids: Sequence[int], fuzz: Fuzz, prompt_len: int) -> Any:
        """Log-probabilities [len(ids), vocab] of the next token after each position, perturbed as ``fuzz`` says."""
        import torch

        point = self.point(fuzz)
        handle = None
        if point > 0 and not fuzz.neutral:

            def hook(_module, _inputs, output):
                stream = output if isinstance(output, torch.Tensor) else output[0]
                new = perturb(stream[0], fuzz, prompt_len).to(stream.dtype)[None]
                return new if isinstance(output, torch.Tensor) else (new, *output[1:])

            handle = self.layers[point - 1].register_forward_hook(hook)
        try:
            with torch.inference_mode():
                t = torch.tensor([list(ids)], dtype=torch.long)
                embeds = self.model.get_input_embeddings()(t)[0]
                if point == 0 and not fuzz.neutral:
                    embeds = perturb(embeds, fuzz, prompt_len).to(embeds.dtype)
                logits = self.model(inputs_embeds=embeds[None], use_cache=False).logits[0]
                return torch.log_softmax(logits.to(torch.float64), dim=-1)
        finally:
            if handle is not None:
                handle.remove()

    def greedy(self, prompt_ids: Sequence[int], fuzz: Fuzz, max_tokens: int) -> list[int]:
        """The reference's greedy continuation (``max_tokens`` tokens; no stop token: vLLM runs with ignore_eos)."""
        ids = list(prompt_ids)
        for _ in range(max_tokens):
            ids.append(int(self.logprobs(ids, fuzz, len(prompt_ids))[-1].argmax()))
        return ids[len(prompt_ids) :]

    def forced(self, prompt_ids: Sequence[int], tokens: Sequence[int], fuzz: Fuzz) -> tuple[list[float], list[float]]:
        """Teacher-forced on ``tokens``: per generated position, the reference's log-prob of that token and its best
        log-prob (their difference is how far the token is from the reference's own greedy choice)."""
        lp = self.logprobs([*prompt_ids, *tokens[:-1]], fuzz, len(prompt_ids))
        rows = lp[len(prompt_ids) - 1 :]
        return [float(rows[i, t]) for i, t in enumerate(tokens)], [float(r.max()) for r in rows]
