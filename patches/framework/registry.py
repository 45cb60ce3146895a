"""The registry of every upstream vLLM symbol the patches change or rely on: data that the code applies, lists and
checks.

Each patch module declares what it changes as a :class:`Patch` named
``PATCH``: its :class:`Target` s, one per upstream symbol, and its header
(the module docstring: what, why, upstream issue/PR, versions verified,
when to remove it). What the patches call, subclass or read of vLLM's
internals *without* changing it is declared in
:mod:`patches.framework.vllm_internals` (kind ``relies_on``), and :func:`load` joins
it to each patch's ``relies_on``: an upgrade that moves one of those breaks
a patch as surely as one that moves a wrapped function. ``patches.register`` applies each enabled patch through
``PATCH.apply()``; the change itself is always made by
:func:`patches.framework._core.install`, which never applies the same change
twice. So the index below cannot drift from what runs:

* ``python -m patches --list`` prints it (``docs/patches.md`` is that
  output, and a test keeps them equal);
* ``python -m patches --check`` checks every target against the installed
  vLLM (it exists, with the parameters and attributes the patch relies on),
  and ``python -m patches --check-against DIR`` checks the same against
  another vLLM source tree (:mod:`patches.framework.upstream_check`), so an upgrade
  starts from the list of what moved.

Kinds of change:

``wrap``
    a function or method replaced, for every caller, by a wrapper that calls
    the original (applied when the patch is).
``rebind``
    an attribute of one *object* replaced at run time (a bound method, or a
    helper object such as the offloading worker), by the wrap named in
    ``applied_by``. The symbol is where the attribute is defined upstream.
``class_swap``
    the class of one object, or a class an object creates things from,
    replaced at run time by a subclass overriding the named method.
``env_default``
    an environment variable vLLM reads, given a default (a user's own value
    wins).
``relies_on``
    nothing changed: a private or internal symbol a patch calls, subclasses
    or reads (a class, a method with the parameters it passes, an attribute,
    a module-level name), checked like the others and never applied.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass, field
from types import ModuleType

from ._core import logger
from .target import Target  # the patch modules declare their targets through this module

# The sections every patch module's header has, in this order (modelled on vllm-ascend's patch docs).
HEADER_SECTIONS = ("What it changes", "Why", "Upstream", "Verified on", "Remove when")


def on_cpu() -> bool:
    """The CPU platform."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


@dataclass(frozen=True)
class Patch:
    """One patch module: its header (the module docstring), the targets it changes, and (joined by :func:`load`,
    from :mod:`patches.framework.vllm_internals`) the upstream symbols it relies on unchanged."""

    doc: str
    targets: tuple[Target, ...]
    module: str = ""
    header: dict[str, str] = field(default_factory=dict, compare=False)
    relies_on: tuple[Target, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "header", parse_header(self.doc))
        if any(t.kind == "relies_on" for t in self.targets) or any(t.kind != "relies_on" for t in self.relies_on):
            raise ValueError("a patch's targets change vLLM; what it relies on unchanged goes in relies_on")

    @property
    def symbols(self) -> tuple[Target, ...]:
        """Every upstream symbol of this patch: what it changes, then what it relies on."""
        return self.targets + self.relies_on

    @property
    def name(self) -> str:
        """The patch's name, from the header's first line (``Patch ``fuzz``: ...``)."""
        m = re.match(r"Patch ``(\w+)``", self.doc.strip())
        return m.group(1) if m else ""

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0].split(": ", 1)[-1].rstrip(".")

    def target(self, symbol: str) -> Target:
        for t in self.targets:
            if t.symbol == symbol:
                return t
        raise KeyError(symbol)

    def apply(self) -> list[str]:
        """Apply every target of this patch applied with it (wraps, env defaults); the symbols changed now."""
        changed = [t.symbol for t in self.targets if t.applied_by is None and t.apply()]
        logger().debug("fuzzserve patch %s: %s", self.name, changed or "already applied")
        return changed


def parse_header(doc: str) -> dict[str, str]:
    """The sections of a patch module's header: a title at column 0 (it may run over several lines), its text
    indented below it. Keys are the known titles (:data:`HEADER_SECTIONS`) a title starts with, else the whole
    title; values the text, unwrapped."""
    sections: dict[str, str] = {}
    title: list[str] = []
    body: list[str] = []

    def close() -> None:
        if title:
            text = " ".join(title)
            sections[next((s for s in HEADER_SECTIONS if text.startswith(s)), text)] = " ".join(body)

    for line in doc.splitlines()[1:]:
        if not line.strip():
            continue
        if line[0].isspace():
            body.append(line.strip())
            continue
        if body:  # a title after a section's text: the next section
            close()
            title, body = [], []
        title.append(line.strip())
    close()
    return sections


def patches() -> dict[str, Patch]:
    """Every patch, by name, in the order ``register`` applies them (imports each patch module)."""
    from .catalogue import PATCH_MODULES

    return {name: load(module) for name, module in PATCH_MODULES.items()}


def load(module_name: str) -> Patch:
    """The ``PATCH`` of a patch module, with its module name and what it relies on
    (:mod:`patches.framework.vllm_internals`)."""
    from .vllm_internals import RELIES_ON

    module: ModuleType = importlib.import_module(module_name)
    patch: Patch = module.PATCH
    if not patch.module:
        object.__setattr__(patch, "module", module_name)
    object.__setattr__(patch, "relies_on", RELIES_ON.get(patch.name, ()))
    return patch


# --------------------------------------------------------------------------- the index


def _condition(t: Target) -> str:
    notes = []
    if t.when is not None:
        doc = inspect.getdoc(t.when)
        if doc is None:  # the index quotes its first line (None.splitlines raised the same AttributeError)
            raise AttributeError(f"{t.symbol}: `{t.when.__name__}()` has no docstring")
        notes.append(f"only where `{t.when.__name__}()`: {doc.splitlines()[0]}")
    if t.optional:
        notes.append("skipped where absent")
    if t.applied_by:
        notes.append(f"applied at run time by the wrap of `{t.applied_by.split(':', 1)[1]}`")
    if t.kind == "env_default":
        notes.append(f"default `{t.value}`")
    return "; ".join(notes)


def _relies_on(t: Target) -> str:
    parts = []
    if t.params:
        parts.append("(" + ", ".join(t.params) + ", ...)")
    if t.keywords:
        parts.append("by name: " + ", ".join(t.keywords))
    if t.attrs:
        parts.append("attributes: " + ", ".join(t.attrs))
    return "; ".join(parts)


def index_markdown(all_patches: dict[str, Patch] | None = None) -> str:
    """The index of every deviation from upstream vLLM: ``python -m patches --list``, committed as docs/patches.md."""
    all_patches = patches() if all_patches is None else all_patches
    from ._core import VERIFIED_VLLM

    n = sum(len(p.targets) for p in all_patches.values())
    n_relied = sum(len(p.relies_on) for p in all_patches.values())
    lines = [
        "# Every change the patches make to vLLM",
        "",
        (
            "Generated by `python -m patches --list > docs/patches.md` from the `PATCH` declarations of the patch "
            "modules (`patches/framework/registry.py`), which are also what `patches.register()` applies, and from "
            "what they "
            "rely on unchanged (`patches/framework/vllm_internals.py`); a test keeps this page equal to that output. "
            "`python -m patches --check` checks every symbol of both tables against the installed vLLM, "
            "`python -m patches --check-against DIR` against another vLLM source tree (an upgrade starts there)."
        ),
        "",
        (
            f"Verified on vLLM {', '.join(VERIFIED_VLLM)}; {n} symbols changed and {n_relied} relied on in "
            f"{len(all_patches)} patches. "
            "Kinds: **wrap** (a function replaced, for every caller, by a wrapper that calls it), **rebind** (an "
            "attribute of one object replaced at run time), **class_swap** (an object's class, or a class it "
            "creates things from, replaced by a subclass), **env_default** (a default for a variable vLLM reads), "
            "**relies_on** (nothing changed: an internal symbol a patch calls, subclasses or reads)."
        ),
        "",
        "## Patches",
        "",
        "| patch | what | upstream | remove when |",
        "|---|---|---|---|",
    ]
    for name, p in all_patches.items():
        lines.append(
            f"| [`{name}`](../{p.module.replace('.', '/')}.py) | {p.summary} | "
            f"{p.header.get('Upstream', '')} | {p.header.get('Remove when', '')} |"
        )
    lines += ["", "## Symbols", "", "| symbol | kind | patch | why | relies on | when |", "|---|---|---|---|---|---|"]
    for name, p in all_patches.items():
        for t in p.targets:
            lines.append(f"| `{t.symbol}` | {t.kind} | {name} | {t.why} | {_relies_on(t)} | {_condition(t)} |")
    lines += ["", "## Internals relied on, unchanged", "", "| symbol | patch | why | relies on |", "|---|---|---|---|"]
    for name, p in all_patches.items():
        for t in p.relies_on:
            lines.append(f"| `{t.symbol}` | {name} | {t.why} | {_relies_on(t)} |")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"
