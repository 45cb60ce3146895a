"""Import rules of the repository's layout: packaged code never imports ``tests``, and a test imports helpers
(``testkit``, ``tests.markers``, ``tests.upstream_vllm``) and fixtures (by name, from ``tests/conftest.py``),
never another test module."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("patches", "serve_app", "load_tests", "fixture_model", "benchmarks", "monitoring", "testkit")


def imported(source: str) -> set[str]:
    """Every absolute module name ``source`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def forbidden(source: str, in_tests: bool) -> list[str]:
    """The imports of ``source`` its place forbids: any of ``tests`` outside tests/; in tests/, a test module
    (``tests.test_*``) or ``tests.conftest``."""
    bad = []
    for name in sorted(imported(source)):
        parts = name.split(".")
        if parts[0] != "tests":
            continue
        if not in_tests or (len(parts) > 1 and (parts[1].startswith("test_") or parts[1] == "conftest")):
            bad.append(name)
    return bad


def test_the_rule_catches_what_it_forbids():
    assert forbidden("from tests.test_fuzz_engine import PROMPTS", in_tests=True) == [
        "tests.test_fuzz_engine", "tests.test_fuzz_engine.PROMPTS"]
    assert forbidden("from tests.conftest import X", in_tests=True)
    assert forbidden("from tests import test_plugin", in_tests=True) == ["tests.test_plugin"]
    assert forbidden("from tests.engine_host import EngineHost", in_tests=False)
    assert forbidden("import tests.markers", in_tests=False)
    assert forbidden("from tests.markers import classify\nfrom testkit.engine_host import EngineHost",
                     in_tests=True) == []


def test_no_test_module_is_imported():
    bad = {}
    for package in PACKAGES:
        for f in (REPO / package).rglob("*.py"):
            if found := forbidden(f.read_text(), in_tests=False):
                bad[str(f.relative_to(REPO))] = found
    for f in (REPO / "tests").glob("*.py"):
        if found := forbidden(f.read_text(), in_tests=True):
            bad[str(f.relative_to(REPO))] = found
    assert not bad, bad
