"""The perturbation itself: pure tensor arithmetic, safe under torch.compile and CUDA graphs.

Per scheduled token the worker fills three persistent buffers (fixed address,
refilled in place each step):

* ``mult``  (float32): ``1 - clamp(s, 0, 1)`` for scale mode, 1 otherwise;
* ``std``   (float32): ``s`` for gaussian mode, 0 otherwise;
* ``key``   (int64):   a 32-bit hash of (request seed, token position).

and the embedding output ``e`` of every token becomes::

    e * mult + std * rms(e) * z(key)

with ``z`` standard normal noise computed *inside the graph* from ``key`` by
an integer hash and Box-Muller. Box-Muller turns two uniforms into two
independent normals; both are used (the first half of the hidden dims gets
the cosine one, the second half the sine one), so each pair of dims costs
two hashes, one log and one square root: the hashing is most of the cost.
There is no branch on any value: a neutral
token (mult 1, std 0) goes through the same arithmetic and comes out
bit-identical (x * 1 + 0 * finite == x).

Why a counter-based hash instead of ``torch.randn``: the noise of a token must
depend only on the request's seed and the token's position, not on which
other requests share the batch, which step it lands in, or the device RNG
state (so the same request gives the same output every time, and a
preempted-and-recomputed prompt gets the same noise again). It also keeps
the per-step CPU work to one int per token instead of one vector per token.

All integer arithmetic stays below 2**63 (values < 2**32 times constants
< 2**31), so no signed overflow happens in eager, Inductor C++ or CUDA code.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

M32 = 0xFFFFFFFF
# Odd multipliers below 2**31 (products with 32-bit values stay below 2**63).
_C1 = 0x7FEB352D
_C2 = 0x2C1B3C6D
_TWO_PI = 2.0 * np.pi
_INV_2_32 = 1.0 / 4294967297.0  # 1 / (2**32 + 1): maps [0, 2**32) + 1 into (0, 1)
_U_C1, _U_C2, _U15, _U16 = np.uint32(_C1), np.uint32(_C2), np.uint32(15), np.uint32(16)
_U_GOLDEN = np.uint32(0x9E3779B9)


def mix32_np(x: np.ndarray) -> np.ndarray:
    """32-bit integer hash (xorshift-multiply) on uint64 arrays holding 32-bit values."""
    return mix32_u32_(x.astype(np.uint32)).astype(np.uint64)


def mix32_u32_(x: np.ndarray) -> np.ndarray:
    """:func:`mix32_np` in place on a uint32 array (returned).

    uint32 arithmetic wraps modulo 2**32 by definition, which is exactly the
    masking the int64 torch version spells out, so this is the same hash with
    no mask and no widening: the worker runs it every step.
    """
    x ^= x >> _U16
    x *= _U_C1
    x ^= x >> _U15
    x *= _U_C2
    x ^= x >> _U16
    return x


def mix32_torch(x: torch.Tensor) -> torch.Tensor:
    """Same hash as :func:`mix32_np` on int64 tensors holding values in [0, 2**32)."""
    return _mix32_(x.clone())


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """:func:`mix32_torch` in place on ``x`` (a fresh intermediate): no new tensor per step of the hash."""
    x ^= x >> 16
    x.mul_(_C1).bitwise_and_(M32)
    x ^= x >> 15
    x.mul_(_C2).bitwise_and_(M32)
    x ^= x >> 16
    return x


@functools.lru_cache(maxsize=4096)
def seed_base(seed: int) -> int:
    """Fold a signed 64-bit seed into a 32-bit per-request base key.

    Cached: the worker asks for it every step for every gaussian request in
    the batch, and it is a pure function of the seed.
    """
    u = seed & 0xFFFFFFFFFFFFFFFF
    lo, hi = u & M32, u >> 32
    return int(mix32_np(np.array([lo ^ int(mix32_np(np.array([hi]))[0])], dtype=np.uint64))[0])


def token_keys(bases: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Per-token keys from per-token request bases and absolute positions (int64 out).

    ``key = bases ^ mix32(pos + 0x9E3779B9)``, then mixed again, all modulo 2**32.
    """
    h = positions.astype(np.uint32)  # positions < 2**31: the cast keeps them
    h += _U_GOLDEN
    mix32_u32_(h)
    h ^= bases.astype(np.uint32)
    return mix32_u32_(h).astype(np.int64)


def dim_codes(hidden_size: int) -> torch.Tensor:
    """Fixed codes [2, ceil(hidden / 2)] (int64), one pair per Box-Muller pair of hidden dims."""
    pairs = (hidden_size + 1) // 2
    idx = np.arange(2 * pairs, dtype=np.uint64)
    codes = mix32_np(mix32_np(idx * np.uint64(2654435761) + np.uint64(12345)))
    return torch.from_numpy(codes.astype(np.int64).reshape(2, pairs))


def gaussian_noise(keys: torch.Tensor, codes: torch.Tensor, hidden_size: int | None = None) -> torch.Tensor:
    """Standard normal noise [n, hidden] (float32), a pure function of ``keys`` [n].

    ``hidden_size`` defaults to ``2 * codes.shape[1]`` (pass it for an odd size).
    """
    pairs = codes.shape[1]
    hidden = 2 * pairs if hidden_size is None else hidden_size
    n = keys.shape[0]
    # One hash over both code rows at once (half the op launches of hashing
    # each row; eager mode on CPU pays per op), then the Box-Muller arithmetic
    # in place on the two halves of the float copy.
    h = _mix32_(torch.bitwise_xor(keys.unsqueeze(-1), codes.reshape(1, 2 * pairs))).to(torch.float32)
    r = h[:, :pairs].add_(1.0).mul_(_INV_2_32).log_().mul_(-2.0).sqrt_()  # u1 in (0, 1]: log is finite
    theta = h[:, pairs:].mul_(_TWO_PI * _INV_2_32)
    z = (torch.cat([torch.cos(theta), torch.sin(theta)], dim=-1).view(n, 2, pairs) * r.unsqueeze(1)).view(n, 2 * pairs)
    return z if z.shape[-1] == hidden else z[:, :hidden]


def perturb(
    embeds: torch.Tensor,
    mult: torch.Tensor,
    std: torch.Tensor,
    keys: torch.Tensor,
    codes: torch.Tensor,
) -> torch.Tensor:
    """Apply the per-token perturbation to ``embeds`` [n, hidden]; see module doc."""
    x = embeds.to(torch.float32)
    rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True))
    z = gaussian_noise(keys, codes, x.shape[-1])
    out = x * mult.unsqueeze(-1) + (std.unsqueeze(-1) * rms) * z
    return out.to(embeds.dtype)


def perturb_sparse(
    embeds: torch.Tensor,
    mult: torch.Tensor,
    std: torch.Tensor,
    keys: torch.Tensor,
    codes: torch.Tensor,
    noise_rows: torch.Tensor,
) -> torch.Tensor:
    """:func:`perturb` computing the noise only for ``noise_rows`` (the tokens with ``std > 0``).

    Eager mode only (the row list is data-dependent): the noise is ~20
    elementwise ops per element and most tokens of a step need none (s = 0,
    or scale mode). Same arithmetic per element as :func:`perturb`, so the
    result is the same; the caller guarantees ``std`` is 0 outside
    ``noise_rows``.
    """
    x = embeds.to(torch.float32)
    out = x * mult.unsqueeze(-1)
    if noise_rows.numel():
        e = x.index_select(0, noise_rows)
        rms = torch.sqrt(torch.mean(e * e, dim=-1, keepdim=True))
        z = gaussian_noise(keys.index_select(0, noise_rows), codes, x.shape[-1])
        out.index_add_(0, noise_rows, (std.index_select(0, noise_rows).unsqueeze(-1) * rms) * z)
    return out.to(embeds.dtype)
