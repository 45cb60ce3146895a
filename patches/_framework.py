"""Plumbing shared by every patch: version gate, on/off switches, idempotence.

vLLM loads ``vllm.general_plugins`` entry points separately in each of its
processes (frontend, EngineCore, workers; the CPU platform always spawns), so
``patches.register`` runs once per process and every patch must be safe to
apply again. Each patch module exposes ``NAME`` and ``apply()``;
:func:`apply_patches` decides which run.

Environment:

``FUZZSERVE_PATCHES_OFF``
    Unset or empty: every patch on. ``all``: every patch off (stock vLLM, for
    A/B runs in the same install). A comma-separated list of patch names:
    those off. An unknown name is an error, not a silent no-op.
``FUZZSERVE_ALLOW_UNVERIFIED_VLLM``
    ``1`` lets the patches load on a vLLM version they were not verified on,
    at your own risk. Without it they refuse with an error naming the version.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

OFF_ENV = "FUZZSERVE_PATCHES_OFF"
ALLOW_UNVERIFIED_ENV = "FUZZSERVE_ALLOW_UNVERIFIED_VLLM"

# Versions every patch in this package was verified on. A patch module may
# narrow this further with its own VERIFIED_VLLM.
VERIFIED_VLLM = ("0.32.0",)

_APPLIED_ATTR = "__fuzzserve_patched__"


class UnverifiedVllmError(RuntimeError):
    """Raised when the installed vLLM is not one the patches were verified on."""


def logger() -> logging.Logger:
    """vLLM's logger when vLLM is importable (its handlers and format), else stdlib."""
    try:
        from vllm.logger import init_logger

        # Under the "vllm." namespace so vLLM's logging config (handlers, format,
        # VLLM_LOGGING_LEVEL) applies in every vLLM process.
        return init_logger("vllm.fuzzserve.patches")
    except ImportError:  # pragma: no cover - vLLM is a hard dependency
        return logging.getLogger("fuzzserve.patches")


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0`` (the CPU and CUDA builds share source)."""
    return version.split("+", 1)[0]


def check_vllm_version(installed: str, verified: tuple[str, ...] = VERIFIED_VLLM) -> None:
    if base_version(installed) in verified:
        return
    if os.environ.get(ALLOW_UNVERIFIED_ENV) == "1":
        logger().warning(
            "fuzzserve patches were verified on vLLM %s, not %s; loading anyway because %s=1.",
            ", ".join(verified), installed, ALLOW_UNVERIFIED_ENV,
        )
        return
    raise UnverifiedVllmError(
        f"fuzzserve patches were verified on vLLM {', '.join(verified)} but vLLM {installed} is "
        f"installed. They patch vLLM internals that change between releases, so they refuse to "
        f"load. Install a verified version, switch the patches off with {OFF_ENV}=all, or set "
        f"{ALLOW_UNVERIFIED_ENV}=1 to load them anyway at your own risk."
    )


def disabled_patches(known: list[str], env: dict[str, str] | None = None) -> set[str]:
    """Parse ``FUZZSERVE_PATCHES_OFF`` into the set of patch names that are off."""
    raw = (env if env is not None else os.environ).get(OFF_ENV, "").strip()
    if not raw:
        return set()
    if raw.lower() == "all":
        return set(known)
    names = {n.strip() for n in raw.split(",") if n.strip()}
    unknown = names - set(known)
    if unknown:
        raise ValueError(
            f"{OFF_ENV} names unknown patch(es) {sorted(unknown)}; known: {sorted(known)} or 'all'"
        )
    return names


def is_enabled(name: str) -> bool:
    """Whether patch ``name`` is switched on in this process's environment."""
    from . import PATCH_MODULES

    return name not in disabled_patches(list(PATCH_MODULES))


def wrap_method(owner: Any, attr: str, make_wrapper: Callable[[Callable], Callable]) -> bool:
    """Replace ``owner.attr`` with ``make_wrapper(original)``, once.

    Returns False (and changes nothing) when ``owner.attr`` is already our
    wrapper: applying a patch twice in one process must not stack wrappers.
    ``staticmethod``/``classmethod`` descriptors are preserved.
    """
    if isinstance(owner, type):
        # Prefer the class's own entry (keeps staticmethod/classmethod
        # descriptors); an inherited method is wrapped onto this class only.
        raw = owner.__dict__.get(attr)
        if raw is None:
            raw = getattr(owner, attr, None)
    else:
        raw = getattr(owner, attr, None)
    if raw is None:
        raise AttributeError(f"{owner!r} has no attribute {attr!r} to patch")
    if getattr(raw, _APPLIED_ATTR, False) or getattr(getattr(raw, "__func__", None), _APPLIED_ATTR, False):
        return False
    descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    original = raw.__func__ if descriptor else raw
    wrapper = make_wrapper(original)
    functools.update_wrapper(wrapper, original)
    setattr(wrapper, _APPLIED_ATTR, True)
    wrapper.__wrapped_original__ = original  # type: ignore[attr-defined]
    setattr(owner, attr, descriptor(wrapper) if descriptor else wrapper)
    return True
