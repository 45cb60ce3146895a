"""The patches' switches, the one place that names and parses them: for the plugin, and for whoever starts engines.

``FUZZSERVE_PATCHES_OFF`` (:data:`OFF_ENV`)
    Unset or empty: every patch on. ``all``: every patch off (stock vLLM, for
    A/B runs in the same install). A comma-separated list of patch names:
    those off. An unknown name is an error, not a silent no-op.
``FUZZSERVE_ALLOW_UNVERIFIED_VLLM`` (:data:`ALLOW_UNVERIFIED_ENV`)
    ``1`` lets the patches load on a vLLM version they were not verified on,
    at your own risk. Without it they refuse with an error naming the version.

Public (``patches.framework._core`` is the plugin's own plumbing): the Serve app
switches one patch off for its replicas (:func:`with_patch_off`), the load
tests ask whether a patch is on for a run (:func:`is_off`), the tests and
benchmarks build engine environments from :data:`OFF_ENV` and :data:`ALL`.
Importing this module imports nothing of vLLM.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

_N = TypeVar("_N", int, float)

OFF_ENV = "FUZZSERVE_PATCHES_OFF"
ALLOW_UNVERIFIED_ENV = "FUZZSERVE_ALLOW_UNVERIFIED_VLLM"
# The value of OFF_ENV that switches every patch off (read case-insensitively).
ALL = "all"


def off_names(value: str | None) -> list[str]:
    """The names a value of :data:`OFF_ENV` lists, in order (``all`` among them as written), unvalidated."""
    return [n.strip() for n in (value or "").split(",") if n.strip()]


def is_off(name: str, value: str | None) -> bool:
    """Whether patch ``name`` is off under ``value`` (a value of :data:`OFF_ENV`; None: unset)."""
    names = off_names(value)
    return name in names or ALL in (n.lower() for n in names)


def disabled_patches(known: Iterable[str], env: Mapping[str, str] | None = None) -> set[str]:
    """The patch names :data:`OFF_ENV` in ``env`` (default: this process's environment) switches off; a
    :class:`ValueError` naming an unknown one."""
    known = list(known)
    names = off_names((os.environ if env is None else env).get(OFF_ENV))
    if ALL in (n.lower() for n in names):
        return set(known)
    unknown = set(names) - set(known)
    if unknown:
        raise ValueError(f"{OFF_ENV} names unknown patch(es) {sorted(unknown)}; known: {sorted(known)} or '{ALL}'")
    return set(names)


def with_patch_off(name: str, value: str | None) -> str:
    """``value`` (of :data:`OFF_ENV`) with patch ``name`` added; kept as is when it says ``all`` or names it."""
    names = off_names(value)
    if not is_off(name, value):
        names.append(name)
    return ",".join(names)


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """An opt-in patch's switch: ``name`` set to ``1`` in ``env`` (default: this process's environment); anything
    else, unset included, is off."""
    return (os.environ if env is None else env).get(name, "").strip() == "1"


def env_number(
    name: str,
    default: _N,
    parse: Callable[[str], _N],
    accept: Callable[[_N], bool],
    expected: str,
    env: Mapping[str, str] | None = None,
) -> _N:
    """A patch's numeric setting from ``name`` in ``env`` (default: this process's environment): ``default`` when
    unset or blank, else ``parse`` of it where ``accept`` holds; a :class:`ValueError` naming the variable, its
    value and what was ``expected`` otherwise."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = parse(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {expected}") from None
    if not accept(value):
        raise ValueError(f"{name}={raw!r}: expected {expected}")
    return value
