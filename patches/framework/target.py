"""One upstream vLLM symbol a patch changes, or relies on unchanged: :class:`Target`, the registry's unit.

A patch module declares its targets in its ``PATCH`` (:class:`patches.framework.registry.Patch`);
what the patches rely on unchanged is declared in :mod:`patches.framework.vllm_internals`.
Every change a target makes goes through :func:`patches.framework._core.install`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ._core import install

Kind = Literal["wrap", "rebind", "class_swap", "env_default", "relies_on"]
KINDS: tuple[Kind, ...] = ("wrap", "rebind", "class_swap", "env_default", "relies_on")


@dataclass(frozen=True)
class Target:
    """One upstream symbol a patch changes, or relies on unchanged (kind ``relies_on``).

    ``symbol`` is ``module:Qualified.name`` (``vllm.v1.request:Request.__init__``;
    for ``env_default``, ``vllm.envs:NAME``; for ``relies_on`` also a class or
    any module-level name, ``vllm.v1.engine.utils:current_platform``). What the
    patch relies on, checked against every vLLM it is pointed at: ``params``,
    the parameters that must come first (after ``self``), in this order (the
    patch passes them by position); ``keywords``, parameters it passes or
    reads by name (of a class: its constructor's, or its dataclass fields);
    ``attrs``, attributes of the owning class (or of the class itself) or its
    instances it reads.
    """

    symbol: str
    kind: Kind
    why: str
    make: Callable[..., Any] | None = None  # wrap / rebind: original -> replacement; class_swap: class -> subclass
    value: str | None = None  # env_default
    params: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    attrs: tuple[str, ...] = ()
    applied_by: str | None = None  # rebind / class_swap: the wrap (its symbol) that applies it at run time
    slot: str | None = None  # rebind / class_swap: the object's attribute replaced, if not the symbol's last name
    when: Callable[[], bool] | None = None  # applied only where this holds
    optional: bool = False  # absent in some builds (not importable, or not defined on that class itself): skipped

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.symbol}: unknown kind {self.kind!r}; one of {KINDS}")
        if ":" not in self.symbol:
            raise ValueError(f"{self.symbol}: a symbol is 'module:Qualified.name'")
        if self.kind == "relies_on":
            if self.make is not None or self.value is not None or self.applied_by is not None or self.slot:
                raise ValueError(f"{self.symbol}: relies_on changes nothing: no make, value, applied_by or slot")
        elif (self.kind == "env_default") != (self.value is not None) or (self.kind == "env_default") == (
            self.make is not None
        ):
            raise ValueError(f"{self.symbol}: an env_default has a value and nothing to make; other kinds the reverse")
        if (self.kind in ("rebind", "class_swap")) != (self.applied_by is not None):
            raise ValueError(f"{self.symbol}: rebind and class_swap targets (only) name the wrap that applies them")

    @property
    def module(self) -> str:
        return self.symbol.split(":", 1)[0]

    @property
    def qualname(self) -> str:
        return self.symbol.split(":", 1)[1]

    @property
    def attr(self) -> str:
        """The attribute replaced: the symbol's last name (``__class__`` for a class swap of an object)."""
        return self.qualname.rsplit(".", 1)[-1]

    def owner(self) -> Any:
        """The module or class that holds the symbol in the installed vLLM (imports it)."""
        obj: Any = importlib.import_module(self.module)
        for part in self.qualname.split(".")[:-1]:
            obj = getattr(obj, part)
        return obj

    def resolve(self) -> Any:
        """The symbol's current value in the installed vLLM (a wrapper, if the patch is applied)."""
        return getattr(self.owner(), self.attr)

    def apply(self) -> bool:
        """Apply a ``wrap`` or ``env_default`` (the kinds applied with the patch); False if it was already applied,
        or was skipped (``when`` does not hold, or an ``optional`` symbol is absent)."""
        if self.kind == "relies_on":
            raise TypeError(f"{self.symbol} is relied on, not changed: nothing to apply")
        if self.applied_by is not None:
            raise TypeError(f"{self.symbol} is applied at run time by {self.applied_by}, on an object")
        if self.when is not None and not self.when():
            return False
        if self.kind == "env_default":
            if self.attr in os.environ:
                return False
            if self.value is None:  # ruled out by __post_init__; os.environ would raise the same TypeError
                raise TypeError(f"{self.symbol}: an env_default without a value")
            os.environ[self.attr] = self.value
            return True
        try:
            owner = self.owner()
        except (ImportError, AttributeError):
            if self.optional:
                return False
            raise
        if self.optional and isinstance(owner, type) and self.attr not in owner.__dict__:
            return False
        return install(owner, self.attr, self._maker())

    def apply_to(self, obj: Any, *args: Any) -> bool:
        """Apply a ``rebind`` or ``class_swap`` to one object (``args`` go to ``make`` after the original)."""
        if self.applied_by is None:
            raise TypeError(f"{self.symbol} ({self.kind}) is applied with its patch, not to an object")
        return install(obj, self.slot or self.attr, self._maker(), *args)

    def _maker(self) -> Callable[..., Any]:
        """``make``: __post_init__ requires it of the kinds applied (install would raise the same AttributeError)."""
        if self.make is None:
            raise AttributeError(f"{self.symbol} ({self.kind}) has no make")
        return self.make
