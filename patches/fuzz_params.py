"""Per-request fuzz settings: parsing, validation and canonical form.

Pure Python (no vLLM, no torch), so the same rules run in the HTTP router, in
vLLM's frontend (where a bad value becomes HTTP 400 / an exception from
``LLM.generate``) and, defensively, in the worker.

A request carries its settings in ``SamplingParams.extra_args`` (the OpenAI
API's ``vllm_xargs``)::

    {"fuzz_strength": 0.5}                                   # scale mode
    {"fuzz_strength": 3, "fuzz_mode": "gaussian", "fuzz_seed": 7}

Rules (see docs/fuzz.md):

* ``fuzz_strength``: a real number, finite, ``0 <= s <= MAX_STRENGTH``.
* ``fuzz_mode``: ``"scale"`` (default) or ``"gaussian"``.
* ``fuzz_seed``: an integer in the signed 64-bit range (default 0); only
  gaussian mode draws from it.
* Any other key starting with ``fuzz_`` is refused (a typo such as
  ``fuzz_strenght`` must not silently mean "no fuzz"). Keys that do not start
  with ``fuzz_`` belong to other features and are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

STRENGTH = "fuzz_strength"
MODE = "fuzz_mode"
SEED = "fuzz_seed"
KEYS = (STRENGTH, MODE, SEED)
PREFIX = "fuzz_"
MODES = ("scale", "gaussian")
# Gaussian noise 1000x a token's own RMS is already pure noise; beyond that
# float32 arithmetic in the model only buys overflow.
MAX_STRENGTH = 1000.0
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


class FuzzParamError(ValueError):
    """A fuzz setting is invalid. ``field`` names the offending key."""

    def __init__(self, field: str, message: str, value: Any = None):
        super().__init__(message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class FuzzSpec:
    """Validated, canonical fuzz settings of one request."""

    strength: float = 0.0
    mode: str = "scale"
    seed: int = 0

    @property
    def is_neutral(self) -> bool:
        """True when the perturbation is the identity (s = 0)."""
        return self.strength == 0.0

    @property
    def scale_multiplier(self) -> float:
        """Factor on the embeddings: ``1 - clamp(s, 0, 1)`` in scale mode, else 1."""
        return 1.0 - min(self.strength, 1.0) if self.mode == "scale" else 1.0

    @property
    def noise_std(self) -> float:
        """Noise standard deviation in units of the token's embedding RMS."""
        return self.strength if self.mode == "gaussian" else 0.0

    def cache_salt(self) -> str | None:
        """A salt that differs whenever the perturbation differs, None when neutral.

        KV computed under one perturbation must never be reused under another
        (prefix cache and offload tier both key on token ids + salt). Settings
        that perturb identically share a salt: every scale-mode s >= 1 zeroes
        the embeddings, and scale mode ignores the seed.
        """
        if self.is_neutral:
            return None
        if self.mode == "scale":
            return f"fuzz:scale:{min(self.strength, 1.0)!r}"
        return f"fuzz:gaussian:{self.strength!r}:{self.seed}"


NEUTRAL = FuzzSpec()


def _is_real_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_fuzz_args(extra_args: Mapping[str, Any] | None) -> FuzzSpec:
    """Validate the fuzz keys of ``extra_args``; raise :class:`FuzzParamError`.

    Returns :data:`NEUTRAL` when no fuzz key is present.
    """
    if not extra_args:
        return NEUTRAL
    if not isinstance(extra_args, Mapping):
        raise FuzzParamError("vllm_xargs", f"vllm_xargs must be an object, got {type(extra_args).__name__}")
    for key in extra_args:
        if isinstance(key, str) and key.startswith(PREFIX) and key not in KEYS:
            raise FuzzParamError(key, f"unknown fuzz parameter {key!r}; allowed: {', '.join(KEYS)}", key)

    strength = extra_args.get(STRENGTH, 0.0)
    if not _is_real_number(strength):
        raise FuzzParamError(STRENGTH, f"{STRENGTH} must be a number, got {type(strength).__name__}", strength)
    try:
        strength = float(strength)
    except OverflowError:  # an integer beyond float's range (a 401-digit JSON number): not echoed back
        sign = "-" if strength < 0 else ""
        raise FuzzParamError(
            STRENGTH,
            f"{STRENGTH} must be <= {MAX_STRENGTH:g}, got an integer of {sign}{len(str(abs(strength)))} digits",
        ) from None
    if not math.isfinite(strength):
        raise FuzzParamError(STRENGTH, f"{STRENGTH} must be finite, got {strength}", strength)
    if strength < 0:
        raise FuzzParamError(STRENGTH, f"{STRENGTH} must be >= 0, got {strength}", strength)
    if strength > MAX_STRENGTH:
        raise FuzzParamError(STRENGTH, f"{STRENGTH} must be <= {MAX_STRENGTH:g}, got {strength}", strength)

    mode = extra_args.get(MODE, "scale")
    if mode not in MODES:
        raise FuzzParamError(MODE, f"{MODE} must be one of {', '.join(MODES)}; got {mode!r}", mode)

    seed = extra_args.get(SEED, 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise FuzzParamError(SEED, f"{SEED} must be an integer, got {type(seed).__name__}", seed)
    if not SEED_MIN <= seed <= SEED_MAX:
        raise FuzzParamError(SEED, f"{SEED} must fit in a signed 64-bit integer, got {seed}", seed)

    # -0.0 == 0.0, but keep the canonical form free of signed zeros.
    return FuzzSpec(strength=strength + 0.0, mode=mode, seed=seed)


def parse_or_neutral(extra_args: Mapping[str, Any] | None) -> tuple[FuzzSpec, FuzzParamError | None]:
    """Like :func:`parse_fuzz_args` but never raises: invalid settings give NEUTRAL.

    For code inside the engine, which must never die from a request that
    somehow skipped frontend validation.
    """
    try:
        return parse_fuzz_args(extra_args), None
    except FuzzParamError as e:
        return NEUTRAL, e
