"""Per-request fuzz settings: parsing, validation, canonical form and the per-token strength.

Pure Python (no vLLM, no torch), so the same rules run in the guard, the
router, vLLM's frontend (where a bad value becomes HTTP 400 / an exception
from ``LLM.generate``) and, defensively, in the worker.

A request carries its settings in ``SamplingParams.extra_args`` (the OpenAI
API's ``vllm_xargs``)::

    {"fuzz_strength": 0.5}                                   # scale mode, input embeddings
    {"fuzz_strength": 3, "fuzz_mode": "gaussian", "fuzz_seed": 7}
    {"fuzz_strength": 0.5, "fuzz_layer": 2}                  # the residual stream leaving decoder layer 2
    {"fuzz_strength": 0, "fuzz_strength_end": 2, "fuzz_ramp_tokens": 8, "fuzz_tokens": "generated",
     "fuzz_mode": "gaussian"}                                # noise ramping up over the first 8 generated tokens

Rules (docs/fuzz.md defines each key):

* ``fuzz_strength``: a real number, finite, ``0 <= s <= MAX_STRENGTH``.
* ``fuzz_mode``: ``"scale"`` (default) or ``"gaussian"``.
* ``fuzz_seed``: an integer in the signed 64-bit range (default 0); only
  gaussian mode draws from it.
* ``fuzz_layer``: an integer (default 0): ``0`` the input embeddings,
  ``k >= 1`` the residual stream leaving decoder layer ``k``, negative counts
  from the end (``-1`` after the last layer). Its range depends on the served
  model, so the parser bounds it loosely (``|k| <= MAX_LAYER``) and the
  frontend checks it against the model's layer count (:func:`resolve_layer`).
* ``fuzz_tokens``: ``"all"`` (default), ``"prompt"`` or ``"generated"``.
* ``fuzz_strength_end`` (same rules as ``fuzz_strength``) and
  ``fuzz_ramp_tokens`` (an integer, ``0 <= R <= MAX_RAMP_TOKENS``, default 0):
  a linear ramp over generated tokens, :meth:`FuzzSpec.strength_at`.
  ``fuzz_ramp_tokens`` without ``fuzz_strength_end`` is refused (it would
  mean nothing).
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
LAYER = "fuzz_layer"
TOKENS = "fuzz_tokens"
STRENGTH_END = "fuzz_strength_end"
RAMP_TOKENS = "fuzz_ramp_tokens"
KEYS = (STRENGTH, MODE, SEED, LAYER, TOKENS, STRENGTH_END, RAMP_TOKENS)
PREFIX = "fuzz_"
MODES = ("scale", "gaussian")
SCOPES = ("all", "prompt", "generated")
# Gaussian noise 1000x a token's own RMS is already pure noise; beyond that
# float32 arithmetic in the model only buys overflow.
MAX_STRENGTH = 1000.0
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# No served model has this many decoder layers; the model's own count is checked where it is known (the frontend).
MAX_LAYER = 100_000
# Longer than any context vLLM serves: a ramp this long never ends within one request.
MAX_RAMP_TOKENS = 10_000_000


class FuzzParamError(ValueError):
    """A fuzz setting is invalid. ``field`` names the offending key."""

    def __init__(self, field: str, message: str, value: Any = None):
        super().__init__(message)
        self.field = field
        self.value = value


@dataclass(frozen=True)
class FuzzSpec:
    """Validated, canonical fuzz settings of one request.

    ``strength`` is the strength of prompt tokens and, without a ramp, of every
    token; ``strength_end`` (None: no ramp) the strength reached after
    ``ramp_tokens`` generated tokens (:meth:`strength_at`). ``layer`` is what
    the client sent (negative values are resolved against the model's layer
    count by :func:`resolve_layer`, where that count is known).
    """

    strength: float = 0.0
    mode: str = "scale"
    seed: int = 0
    layer: int = 0
    tokens: str = "all"
    strength_end: float | None = None
    ramp_tokens: int = 0

    @property
    def has_ramp(self) -> bool:
        return self.strength_end is not None

    def strength_at(self, position: int, prompt_len: int) -> float:
        """The strength of the token at absolute ``position`` of a request with ``prompt_len`` prompt tokens.

        The definition (docs/fuzz.md): with ``g = position - prompt_len`` (the
        token's index among generated tokens; negative for prompt tokens),
        a token out of scope (``fuzz_tokens``) gets 0; a prompt token gets
        ``strength``; a generated token gets ``strength`` without a ramp, and
        with one ``strength + (strength_end - strength) * min(g / R, 1)``
        (``R = ramp_tokens``; ``R = 0`` is a step: ``strength_end`` from the
        first generated token on).
        """
        g = position - prompt_len
        if (self.tokens == "prompt" and g >= 0) or (self.tokens == "generated" and g < 0):
            return 0.0
        if g < 0 or self.strength_end is None:
            return self.strength
        frac = 1.0 if self.ramp_tokens == 0 else min(g / self.ramp_tokens, 1.0)
        return self.strength + (self.strength_end - self.strength) * frac

    @property
    def max_strength(self) -> float:
        """The largest strength any token of the request can get (0: the request perturbs nothing)."""
        prompt = self.strength if self.tokens != "generated" else 0.0
        if self.tokens == "prompt":
            return prompt
        if self.strength_end is None:
            generated = self.strength
        elif self.ramp_tokens == 0:
            generated = self.strength_end
        else:
            generated = max(self.strength, self.strength_end)
        return max(prompt, generated)

    @property
    def is_neutral(self) -> bool:
        """True when the perturbation is the identity for every token (no token gets a strength above 0)."""
        return self.max_strength == 0.0

    @property
    def depends_on_prompt_length(self) -> bool:
        """Whether a token's perturbation depends on where the prompt ends (a scope or a ramp), not only on its
        position: KV computed for such a request can be reused only by requests whose prompt ends at the same place
        (a generated token of one request is a prompt token of a request that continues it)."""
        return not self.is_neutral and (self.tokens != "all" or self.strength_end is not None)

    @property
    def scale_multiplier(self) -> float:
        """Factor on the embeddings of a token at ``strength``: ``1 - clamp(s, 0, 1)`` in scale mode, else 1."""
        return 1.0 - min(self.strength, 1.0) if self.mode == "scale" else 1.0

    @property
    def noise_std(self) -> float:
        """Noise standard deviation at ``strength``, in units of the perturbed token's RMS."""
        return self.strength if self.mode == "gaussian" else 0.0

    def cache_salt(self) -> str | None:
        """A salt that differs whenever the settings differ, None when neutral.

        KV computed under one perturbation must never be reused under another
        (prefix cache and offload tier both key on token ids + salt). For the
        embedding keys alone, settings that perturb identically share a salt
        (every scale-mode s >= 1 zeroes the embeddings; scale mode ignores the
        seed): the salts of requests without the depth, scope and schedule keys
        are what they were before those keys existed. Any of those keys set away
        from its default adds itself, as sent, so requests that differ in one of
        them never share KV. The engine adds the prompt length where
        :attr:`depends_on_prompt_length` (``patches.fuzz.salted``).
        """
        if self.is_neutral:
            return None
        if self.mode == "scale":
            s = self.strength if self.strength_end is not None else min(self.strength, 1.0)
            salt = f"fuzz:scale:{s!r}"
        else:
            salt = f"fuzz:gaussian:{self.strength!r}:{self.seed}"
        if self.layer != 0:
            salt += f":layer={self.layer}"
        if self.tokens != "all":
            salt += f":tokens={self.tokens}"
        if self.strength_end is not None:
            salt += f":end={self.strength_end!r}:ramp={self.ramp_tokens}"
        return salt


NEUTRAL = FuzzSpec()


def resolve_layer(layer: int, num_layers: int) -> int | None:
    """The point a ``fuzz_layer`` value names in a model of ``num_layers`` decoder layers, ``0 ..
    num_layers`` (0: the input embeddings; k: the residual stream leaving decoder layer k), or None when out of
    range. Negative values count from the end, as Python indexes the ``num_layers + 1`` points: ``-1`` is after
    the last layer, ``-(num_layers + 1)`` the embeddings."""
    point = layer if layer >= 0 else num_layers + 1 + layer
    return point if 0 <= point <= num_layers else None


@dataclass(frozen=True)
class LayerReport:
    """What an engine's workers found of the served model's decoder layers (``patches.fuzz_layer``), as the
    frontend holds it: ``layers``, the model's decoder-layer count, and ``reason``, why a layer cannot be
    perturbed (None: every layer can)."""

    layers: int
    reason: str | None = None

    def refusal(self, spec: FuzzSpec) -> FuzzParamError | None:
        """Why this engine must refuse ``spec``'s ``fuzz_layer`` (None: it can serve it). Any value but 0 needs
        reachable layers and must name a point of this model, neutral or not: a client learns its mistake."""
        if spec.layer == 0:
            return None
        if self.reason is not None:
            return FuzzParamError(
                LAYER,
                f"{LAYER} is not available on this server: {self.reason}; only {LAYER} 0 (the input embeddings)",
                spec.layer,
            )
        if resolve_layer(spec.layer, self.layers) is None:
            return FuzzParamError(
                LAYER,
                f"{LAYER} must be between {-(self.layers + 1)} and {self.layers} for this model "
                f"({self.layers} decoder layers), got {spec.layer}",
                spec.layer,
            )
        return None


NO_LAYER_REPORT = "the fuzz_layer patch is not on in this server (FUZZSERVE_PATCHES_OFF)"


def _is_real_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _strength(extra_args: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = extra_args.get(key, default)
    if value is None and default is None and key not in extra_args:
        return None
    if not _is_real_number(value):
        raise FuzzParamError(key, f"{key} must be a number, got {type(value).__name__}", value)
    try:
        value = float(value)
    except OverflowError:  # an integer beyond float's range (a 401-digit JSON number): not echoed back
        sign = "-" if value < 0 else ""
        raise FuzzParamError(
            key, f"{key} must be <= {MAX_STRENGTH:g}, got an integer of {sign}{len(str(abs(value)))} digits"
        ) from None
    if not math.isfinite(value):
        raise FuzzParamError(key, f"{key} must be finite, got {value}", value)
    if value < 0:
        raise FuzzParamError(key, f"{key} must be >= 0, got {value}", value)
    if value > MAX_STRENGTH:
        raise FuzzParamError(key, f"{key} must be <= {MAX_STRENGTH:g}, got {value}", value)
    return value + 0.0  # -0.0 == 0.0, but keep the canonical form free of signed zeros


def _integer(extra_args: Mapping[str, Any], key: str, default: int, low: int, high: int, what: str) -> int:
    value = extra_args.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FuzzParamError(key, f"{key} must be an integer, got {type(value).__name__}", value)
    if not low <= value <= high:
        shown = value if len(str(value)) <= 40 else f"an integer of {len(str(abs(value)))} digits"
        raise FuzzParamError(key, f"{key} must be {what}, got {shown}", value if shown == value else None)
    return value


def _choice(extra_args: Mapping[str, Any], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = extra_args.get(key, default)
    if not isinstance(value, str) or value not in choices:
        raise FuzzParamError(key, f"{key} must be one of {', '.join(choices)}; got {value!r}", value)
    return value


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
    if not any(key in extra_args for key in KEYS):
        return NEUTRAL
    strength = _strength(extra_args, STRENGTH, 0.0)
    assert strength is not None  # a default was given
    mode = _choice(extra_args, MODE, "scale", MODES)
    seed = _integer(extra_args, SEED, 0, SEED_MIN, SEED_MAX, "a signed 64-bit integer")
    layer = _integer(extra_args, LAYER, 0, -MAX_LAYER, MAX_LAYER, f"an integer within +-{MAX_LAYER}")
    tokens = _choice(extra_args, TOKENS, "all", SCOPES)
    strength_end = _strength(extra_args, STRENGTH_END, None)
    ramp = _integer(extra_args, RAMP_TOKENS, 0, 0, MAX_RAMP_TOKENS, f"an integer from 0 to {MAX_RAMP_TOKENS}")
    if RAMP_TOKENS in extra_args and strength_end is None:
        raise FuzzParamError(
            RAMP_TOKENS, f"{RAMP_TOKENS} needs {STRENGTH_END} (the strength the ramp reaches)", extra_args[RAMP_TOKENS]
        )
    return FuzzSpec(
        strength=strength,
        mode=mode,
        seed=seed,
        layer=layer,
        tokens=tokens,
        strength_end=strength_end,
        ramp_tokens=ramp,
    )


def parse_or_neutral(extra_args: Mapping[str, Any] | None) -> tuple[FuzzSpec, FuzzParamError | None]:
    """Like :func:`parse_fuzz_args` but never raises: invalid settings give NEUTRAL.

    For code inside the engine, which must never die from a request that
    somehow skipped frontend validation.
    """
    try:
        return parse_fuzz_args(extra_args), None
    except FuzzParamError as e:
        return NEUTRAL, e
