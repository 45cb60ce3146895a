"""What the two layout tests (tests/test_layout.py, tests/test_load_tests_layout.py) read the same way: a file's
module name, the absolute prefix a relative import names, and a circle in a module graph. A helper, not a test
module, so that both may import it."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted module name of ``path`` under ``root`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def from_prefix(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` in ``module`` names, its relative dots resolved."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    return ".".join([*base[: len(base) - node.level + 1], *([node.module] if node.module else [])])


def circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (its modules in order), or [] if it has none."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        return list(e.args[1])
    return []
