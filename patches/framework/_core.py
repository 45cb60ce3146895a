"""Plumbing shared by every patch: version gate, on/off switches, idempotence.

vLLM loads ``vllm.general_plugins`` entry points separately in each of its
processes (frontend, EngineCore, workers; the CPU platform always spawns), so
``patches.register`` runs once per process and every patch must be safe to
apply again. Each patch module declares what it changes in vLLM as a
:class:`patches.framework.registry.Patch` (``PATCH``); ``patches.register`` decides
which patches run and applies each through its ``PATCH``, and every change
of every kind goes through :func:`install`, which will not apply the same
change twice to the same thing.

The switches (``FUZZSERVE_PATCHES_OFF``, ``FUZZSERVE_ALLOW_UNVERIFIED_VLLM``)
are named and parsed in :mod:`patches.framework.switches`, the public module that the
app and the tools use too.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from .switches import ALL, ALLOW_UNVERIFIED_ENV, OFF_ENV

# Versions every patch in this package was verified on (each patch module's
# header says the same under "Verified on"; tests/test_patch_registry.py checks it).
VERIFIED_VLLM = ("0.32.0",)

# Set on everything install() puts in place: True, and the key of the change.
_APPLIED_ATTR = "__fuzzserve_patched__"
_KEY_ATTR = "__fuzzserve_key__"
_ORIGINAL_ATTR = "__wrapped_original__"


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
            ", ".join(verified),
            installed,
            ALLOW_UNVERIFIED_ENV,
        )
        return
    raise UnverifiedVllmError(
        f"fuzzserve patches were verified on vLLM {', '.join(verified)} but vLLM {installed} is "
        f"installed. They patch vLLM internals that change between releases, so they refuse to "
        f"load. Install a verified version, switch the patches off with {OFF_ENV}={ALL}, or set "
        f"{ALLOW_UNVERIFIED_ENV}=1 to load them anyway at your own risk."
    )


def change_key(make: Callable) -> str:
    """The identity of a change: its maker's qualified name (stable across re-imports of the module)."""
    return f"{make.__module__}.{make.__qualname__}"


def installed_keys(obj: Any) -> set[str]:
    """The keys of every change :func:`install` stacked on ``obj`` (a function, bound method, class or object).

    Follows each replacement to the original it replaced, so a change made
    by one patch on top of another's is seen through.
    """
    keys: set[str] = set()
    seen: set[int] = set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        obj = getattr(obj, "__func__", obj)  # staticmethod / classmethod / bound method
        key = getattr(obj, _KEY_ATTR, None) if not isinstance(obj, type) else obj.__dict__.get(_KEY_ATTR)
        if key is not None:
            keys.add(key)
        obj = obj.__dict__.get(_ORIGINAL_ATTR) if isinstance(obj, type) else getattr(obj, _ORIGINAL_ATTR, None)
    return keys


def upstream_of(obj: Any) -> Any:
    """The upstream function behind every change :func:`install` stacked on ``obj`` (``obj`` itself if none)."""
    while True:
        inner = getattr(getattr(obj, "__func__", obj), _ORIGINAL_ATTR, None)
        if inner is None:
            return obj
        obj = inner


def install(owner: Any, attr: str, make: Callable[..., Any], *args: Any, key: str | None = None) -> bool:
    """Replace ``owner.attr`` with ``make(original, *args)``, once: the one way every patch changes vLLM.

    ``owner`` is a module or a class (a wrap), or an object (a rebind of one
    of its attributes; ``attr="__class__"`` swaps its class). Returns False,
    changing nothing, when the change ``key`` (default: :func:`change_key`
    of ``make``) is already in place on ``owner.attr``: applying a patch
    twice in one process must not stack it twice. Changes of different
    patches to the same symbol stack. ``staticmethod``/``classmethod``
    descriptors are preserved; a replacement function gets the original's
    name and docstring.
    """
    key = key or change_key(make)
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
    if key in installed_keys(raw):
        return False
    descriptor = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    original = raw.__func__ if descriptor else raw
    new = make(original, *args)
    if inspect.isfunction(new) and (inspect.isfunction(original) or inspect.ismethod(original)):
        functools.update_wrapper(new, original)
    for name, value in ((_APPLIED_ATTR, True), (_KEY_ATTR, key), (_ORIGINAL_ATTR, original)):
        setattr(new, name, value)
    setattr(owner, attr, descriptor(new) if descriptor else new)
    return True
