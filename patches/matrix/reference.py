"""An independent reference of fuzz: the Hugging Face model, perturbed by code that shares nothing with the patch.

What fuzz promises (docs/fuzz.md): every token the model reads, prompt and
generated alike, enters it as ``e * mult + std * rms(e) * z``, where ``e`` is
the output of the model's input-embedding module, ``mult = 1 - clamp(s, 0,
1)`` in scale mode, ``std = s`` in gaussian mode, and ``z`` is standard
normal noise that depends only on the request's seed and the token's
absolute position. Whatever the model does after its embedding module
(Gemma's ``sqrt(hidden)``, Granite's multiplier, GPT-2's learned positions)
it then does to the perturbed embeddings.

This module computes that with transformers' own model (its
``inputs_embeds`` argument) and re-derives the noise from the hash's
definition in plain Python integers and float64 (:func:`noise`), not from
:mod:`patches.fuzz_math`'s numpy and torch code. A bug in the patch's
arithmetic, in its buffers or in where it hooks the model therefore shows
up as a disagreement, and the noise's float32-versus-float64 difference
(below 1e-6 of an embedding's scale) is far below what the judge tolerates.
"""

from __future__ import annotations

import math
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

    def xargs(self) -> dict[str, Any] | None:
        if self.strength is None:
            return None
        if self.mode == "scale":
            return {"fuzz_strength": self.strength}
        return {"fuzz_strength": self.strength, "fuzz_mode": self.mode, "fuzz_seed": self.seed}

    @property
    def label(self) -> str:
        if self.strength is None:
            return "none"
        return f"{self.mode} {self.strength:g}" + (f" seed {self.seed}" if self.mode == "gaussian" else "")


def perturb(embeds: Any, fuzz: Fuzz) -> Any:
    """``embeds`` [n, hidden] (positions 0..n-1 of one request) perturbed as ``fuzz`` says, in float64."""
    import torch

    x = embeds.to(torch.float64)
    s = fuzz.strength or 0.0
    if fuzz.mode == "scale":
        return x * (1.0 - min(max(s, 0.0), 1.0))
    n, hidden = x.shape
    z = torch.tensor([noise(fuzz.seed, p, hidden) for p in range(n)], dtype=torch.float64)
    rms = torch.sqrt(torch.mean(embeds.to(torch.float32).to(torch.float64) ** 2, dim=-1, keepdim=True))
    return x + s * rms * z


class Reference:
    """A transformers model that reads perturbed embeddings: greedy continuations and per-position log-probs."""

    def __init__(self, model_path: str):
        import torch
        import transformers

        # the class the checkpoint names (a multimodal model's too: its text path is what the matrix compares)
        config = transformers.AutoConfig.from_pretrained(model_path)
        model_class = getattr(transformers, config.architectures[0])
        torch.manual_seed(0)
        self.model = model_class.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()

    def logprobs(self, ids: Sequence[int], fuzz: Fuzz) -> Any:
        """Log-probabilities [len(ids), vocab] of the next token after each position, every token perturbed."""
        import torch

        with torch.inference_mode():
            t = torch.tensor([list(ids)], dtype=torch.long)
            embeds = self.model.get_input_embeddings()(t)[0]
            perturbed = perturb(embeds, fuzz).to(embeds.dtype)
            logits = self.model(inputs_embeds=perturbed[None], use_cache=False).logits[0]
            return torch.log_softmax(logits.to(torch.float64), dim=-1)

    def greedy(self, prompt_ids: Sequence[int], fuzz: Fuzz, max_tokens: int) -> list[int]:
        """The reference's greedy continuation (``max_tokens`` tokens; no stop token: vLLM runs with ignore_eos)."""
        ids = list(prompt_ids)
        for _ in range(max_tokens):
            ids.append(int(self.logprobs(ids, fuzz)[-1].argmax()))
        return ids[len(prompt_ids) :]

    def forced(self, prompt_ids: Sequence[int], tokens: Sequence[int], fuzz: Fuzz) -> tuple[list[float], list[float]]:
        """Teacher-forced on ``tokens``: per generated position, the reference's log-prob of that token and its best
        log-prob (their difference is how far the token is from the reference's own greedy choice)."""
        lp = self.logprobs([*prompt_ids, *tokens[:-1]], fuzz)
        rows = lp[len(prompt_ids) - 1 :]
        return [float(rows[i, t]) for i, t in enumerate(tokens)], [float(r.max()) for r in rows]
