"""The directions of the repository's imports: shipped code never imports what exists to test or measure it;
and a test module runs its tests, never another test (a shared helper instead).

Each top-level package may import only the packages below it here; a test
imports helpers (``testkit``, ``tests.markers``) and fixtures (by name, from
``tests/conftest.py``), never another test module.

============== ================================================================
package        may import
============== ================================================================
patches        nothing of the project (it is a vLLM plugin)
fixture_model  nothing of the project
serve_app      patches: the production app builder takes its model from its
               config, it does not build the fixture model
load_tests     patches, serve_app, fixture_model (it deploys and sweeps it)
monitoring     patches, serve_app: its rules and dashboard read the observability
               contract (``serve_app.observability.contract``), as the load tests do
testkit        the shipped packages above
benchmarks     the shipped packages and testkit
============== ================================================================

Within the shipped packages, a module whose name starts with ``_`` is its
package's own (``patches.framework._core``): no other package imports it.

An import is any ``import``/``from ... import`` anywhere in a file (a lazy
one inside a function too) and ``importlib.import_module("...")`` with a
literal name.

No module imports another in a circle, anywhere in the repository, these
imports counted (a lazy import or one under ``TYPE_CHECKING`` does not hide a
circle from the reader, only from the interpreter).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.import_graph import circle, from_prefix, module_name

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("patches", "fixture_model", "serve_app", "load_tests", "monitoring")
ALLOWED: dict[str, frozenset[str]] = {
    "patches": frozenset(),
    "fixture_model": frozenset(),
    "serve_app": frozenset({"patches"}),
    "load_tests": frozenset({"patches", "serve_app", "fixture_model"}),
    "monitoring": frozenset({"patches", "serve_app"}),
    "testkit": frozenset(SHIPPED),
    "benchmarks": frozenset({*SHIPPED, "testkit"}),
}
PROJECT = frozenset({*ALLOWED, "tests"})


def imported(source: str) -> set[str]:
    """Every absolute module name ``source`` imports (``from a.b import c`` gives ``a.b`` and ``a.b.c``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def forbidden(source: str, package: str) -> list[str]:
    """The imports of ``source`` (a file of ``package``, or of ``tests``) that its place forbids."""
    bad = []
    for name in sorted(imported(source)):
        parts = name.split(".")
        top = parts[0]
        if package == "tests":
            if top == "tests" and len(parts) > 1 and (parts[1].startswith("test_") or parts[1] == "conftest"):
                bad.append(name)
        elif top in PROJECT and top != package and top not in ALLOWED[package]:
            bad.append(name)
        elif top != package and top in SHIPPED and any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
            bad.append(name)  # another package's private module
    return bad


def violations(root: Path) -> dict[str, list[str]]:
    """Every file under ``root``'s packages (and ``tests/``) with the imports its place forbids."""
    bad = {}
    for package in (*ALLOWED, "tests"):
        for f in sorted((root / package).rglob("*.py")):
            if found := forbidden(f.read_text(), package):
                bad[str(f.relative_to(root))] = found
    return bad


@pytest.mark.parametrize(
    "package, source, want",
    [
        ("load_tests", "from testkit.echo_server import start", ["testkit.echo_server", "testkit.echo_server.start"]),
        (
            "monitoring",
            "def f():\n    from testkit.monitoring import e2e",
            ["testkit.monitoring", "testkit.monitoring.e2e"],
        ),
        (
            "serve_app",
            "from fixture_model.build import ensure_model",
            ["fixture_model.build", "fixture_model.build.ensure_model"],
        ),
        ("serve_app", "import load_tests.cli", ["load_tests.cli"]),
        ("patches", "import importlib\nimportlib.import_module('serve_app.app')", ["serve_app.app"]),
        ("fixture_model", "import benchmarks.harness.host", ["benchmarks.harness.host"]),
        ("testkit", "from benchmarks.harness import host", ["benchmarks.harness", "benchmarks.harness.host"]),
        ("benchmarks", "import tests.markers", ["tests.markers"]),
        (
            "serve_app",
            "from patches.framework._core import OFF_ENV",
            ["patches.framework._core", "patches.framework._core.OFF_ENV"],
        ),
        ("tests", "from patches import _framework", []),  # the tests of the plumbing itself
        (
            "tests",
            "from tests.test_fuzz_engine import PROMPTS",
            ["tests.test_fuzz_engine", "tests.test_fuzz_engine.PROMPTS"],
        ),
        ("tests", "from tests import test_plugin", ["tests.test_plugin"]),
        ("tests", "from tests.conftest import X", ["tests.conftest", "tests.conftest.X"]),
    ],
)
def test_the_rule_catches_what_it_forbids(package, source, want):
    assert forbidden(source, package) == want


@pytest.mark.parametrize(
    "package, source",
    [
        (
            "load_tests",
            "from serve_app.routing.routers import ROUTERS\nfrom fixture_model.tasks import held_out_examples",
        ),
        ("benchmarks", "from testkit.engine_host import EngineHost\nfrom load_tests.judge.summary import percentiles"),
        ("tests", "from tests.markers import classify\nfrom testkit.engine_host import EngineHost"),
        ("serve_app", "from .guard import GuardConfig\nimport ray"),
    ],
)
def test_the_rule_allows_the_directions_of_the_table(package, source):
    assert forbidden(source, package) == []


def test_a_planted_bad_import_in_a_tree_is_found(tmp_path):
    for package in (*ALLOWED, "tests"):
        (tmp_path / package).mkdir()
    (tmp_path / "load_tests" / "ok.py").write_text("from load_tests.operate.ports import free_port\n")
    (tmp_path / "load_tests" / "rig.py").write_text("def start():\n    from testkit import echo_server\n")
    assert violations(tmp_path) == {"load_tests/rig.py": ["testkit", "testkit.echo_server"]}


def test_every_package_imports_only_below_it():
    assert not violations(REPO), violations(REPO)


def calls_to_tests(source: str) -> list[str]:
    """The tests a test module calls itself (a test calling another runs it twice and ties it to file order)."""
    tree = ast.parse(source)
    tests = {
        n.name
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_")
    }
    return sorted(
        {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in tests
        }
    )


def test_a_test_calling_another_is_found():
    assert calls_to_tests("def test_a(x):\n    pass\n\ndef test_b(x):\n    test_a(x)\n") == ["test_a"]
    assert calls_to_tests("def check_a(x):\n    pass\n\ndef test_b(x):\n    check_a(x)\n") == []


def test_no_test_calls_another():
    bad = {
        f.name: found for f in sorted((REPO / "tests").glob("test_*.py")) if (found := calls_to_tests(f.read_text()))
    }
    assert not bad, f"share a helper instead: {bad}"


def import_graph(root: Path) -> dict[str, set[str]]:
    """Every module of the repository's packages -> the repository's modules it imports (relative imports resolved;
    ``from a.b import c`` names ``a.b.c`` when that is a module, else ``a.b``)."""
    files = {module_name(p, root): p for package in (*ALLOWED, "tests") for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                prefix = from_prefix(node, module, path.name == "__init__.py")
                names |= {prefix} | {f"{prefix}.{a.name}" for a in node.names}
        names |= imported(path.read_text())
        for name in names:
            parts = name.split(".")
            target = next((m for m in (".".join(parts[:cut]) for cut in range(len(parts), 0, -1)) if m in files), None)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def test_a_planted_circle_through_a_lazy_import_is_found(tmp_path):
    for package in (*ALLOWED, "tests"):
        (tmp_path / package).mkdir()
    (tmp_path / "serve_app" / "__init__.py").write_text("")
    (tmp_path / "serve_app" / "a.py").write_text("from serve_app.b import X\n")
    (tmp_path / "serve_app" / "b.py").write_text("X = 1\n")
    assert circle(import_graph(tmp_path)) == []
    (tmp_path / "serve_app" / "b.py").write_text("X = 1\n\n\ndef f():\n    from . import a\n")
    assert set(circle(import_graph(tmp_path))) == {"serve_app.a", "serve_app.b"}


def test_no_import_circle_anywhere():
    assert circle(import_graph(REPO)) == []


# Issue 70: modules a reader can hold. A function over LONG_FUNCTION lines, or a module over LONG_MODULE lines, says
# why in its docstring ("Long because ...", "Long on purpose: ...", or a module's "Over N lines because ...").
LONG_FUNCTION = 80
LONG_MODULE = 800
REASON = ("long because", "long on purpose", "lines because")


def too_long(source: str, name: str) -> list[str]:
    """The functions of ``source`` (a module called ``name``) over :data:`LONG_FUNCTION` lines, and the module
    itself over :data:`LONG_MODULE`, whose docstring gives no reason."""
    tree = ast.parse(source)
    found = []
    if len(source.splitlines()) > LONG_MODULE and not any(r in (ast.get_docstring(tree) or "").lower() for r in REASON):
        found.append(name)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > LONG_FUNCTION and not any(r in (ast.get_docstring(node) or "").lower() for r in REASON):
                found.append(f"{name}:{node.name} ({lines} lines)")
    return found


def test_no_long_function_or_module_without_its_reason():
    found = []
    for package in (*SHIPPED, "testkit", "benchmarks"):
        for f in sorted((REPO / package).rglob("*.py")):
            found += too_long(f.read_text(), str(f.relative_to(REPO)))
    assert found == []


def test_the_length_check_finds_a_long_function_without_a_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(LONG_FUNCTION))
    assert too_long(f'def f():\n    """Short."""\n{body}\n', "m.py") == [f"m.py:f ({LONG_FUNCTION + 2} lines)"]
    assert too_long(f'def f():\n    """Long because it is one table."""\n{body}\n', "m.py") == []
