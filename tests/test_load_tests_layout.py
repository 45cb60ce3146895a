"""``load_tests/`` is a house by role: each subpackage imports only the roles below it, no module imports another
in a circle, and no import inside a function or under ``TYPE_CHECKING`` hides a circle.

============ ======================================================================
role         what it holds (bottom first)
============ ======================================================================
errors       the typed errors library code raises (only the CLI makes exit codes)
command_logs how the commands log to the terminal (every CLI of the project uses it)
plan         scenarios, profiles, the request mix, SLOs, operation steps: frozen data
observe      scraping the replicas' metrics, their counters, the invariants, the monitor
load         the HTTP client and the drivers that keep requests in flight
results      the typed records of a run: events and the summary
operate      deploying, the target's replicas, the operation steps' behaviour, the operator
judge        figures, fault evidence, departures, probes, the verdict
report       summary.json, requests.jsonl, report.md, plots, the console table
runner       the load loop, the capacity search's driver, ``run()``
cli          the command line (``__main__`` above it)
============ ======================================================================

A role may import any role below it and its own modules (``plan`` and
``observe`` share the ground floor and import neither each other).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.import_graph import circle, from_prefix, module_name

REPO = Path(__file__).resolve().parents[1]
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "command_logs"}),
    frozenset({"plan", "observe"}),
    frozenset({"load"}),
    frozenset({"results"}),
    frozenset({"operate"}),
    frozenset({"judge"}),
    frozenset({"report"}),
    frozenset({"runner"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
LEVEL = {role: i for i, roles in enumerate(LAYERS) for role in roles}


def resolve(node: ast.ImportFrom | ast.Import, module: str, is_package: bool) -> list[str]:
    """The absolute ``load_tests`` modules (or names in them) an import statement names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "load_tests"]
    prefix = from_prefix(node, module, is_package)
    if prefix.split(".")[0] != "load_tests":
        return []
    return [f"{prefix}.{a.name}" for a in node.names]  # a module, or a name in the module ``prefix``


def imports(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """``load_tests`` module -> the ``load_tests`` modules it imports; and every import of a ``load_tests`` module
    made inside a function or under ``if TYPE_CHECKING:`` (file:line), which exists only to dodge a circle."""
    files = {module_name(p, root): p for p in sorted((root / "load_tests").rglob("*.py"))}
    graph: dict[str, set[str]] = {m: set() for m in files}
    hidden: list[str] = []
    for mod, path in files.items():
        tree = ast.parse(path.read_text())
        top_level = set()
        for stmt in tree.body:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                top_level.add(id(stmt))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = resolve(node, mod, path.name == "__init__.py")
            if not names:
                continue
            if id(node) not in top_level:
                hidden.append(f"{path.relative_to(root)}:{node.lineno}")
            for name in names:
                target = name if name in files else name.rsplit(".", 1)[0]
                if target in files and target != mod:
                    graph[mod].add(target)
    return graph, hidden


def role(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a role above the importer's, or across the ground floor (plan <-> observe)."""
    bad = []
    for mod, deps in graph.items():
        for dep in deps:
            a, b = role(mod), role(dep)
            if a == b or "__init__" in (a, b):
                continue
            if LEVEL.get(b, 99) >= LEVEL.get(a, -1):
                bad.append(f"{mod} -> {dep}")
    return sorted(bad)


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "load_tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(tmp_path).parents:
            if parent != Path(".") and not (tmp_path / parent / "__init__.py").exists():
                (tmp_path / parent / "__init__.py").write_text("")
        path.write_text(text)
    return tmp_path


GOOD = {
    "plan/steps.py": "X = 1\n",
    "results/events.py": "from ..plan.steps import X\n",
    "judge/verdict.py": "from load_tests.results import events\nfrom ..plan import steps\n",
}


def test_a_tree_that_keeps_the_rules_passes(tmp_path):
    graph, hidden = imports(plant(tmp_path, GOOD))
    assert graph["load_tests.judge.verdict"] == {"load_tests.results.events", "load_tests.plan.steps"}
    assert not upward(graph) and not circle(graph) and not hidden


@pytest.mark.parametrize(
    "planted, finds",
    [
        ({"plan/steps.py": "from ..results.events import Y\n"}, "upward"),  # plan reads results: back up
        ({"observe/monitor.py": "from ..plan.steps import X\n"}, "upward"),  # across the ground floor
        ({"results/models.py": "from .events import Z\n", "results/events.py": "from .models import W\n"}, "circle"),
        ({"judge/summary.py": "def f():\n    from ..runner import loop\n"}, "hidden"),
        (
            {
                "judge/summary.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..results import events\n"  # noqa: E501
            },
            "hidden",
        ),
    ],
)
def test_each_rule_catches_its_bad_case(tmp_path, planted, finds):
    graph, hidden = imports(plant(tmp_path, {**GOOD, **planted}))
    found = {"upward": bool(upward(graph)), "circle": bool(circle(graph)), "hidden": bool(hidden)}
    assert found[finds], (graph, hidden)


def test_load_tests_is_a_house_by_role():
    graph, hidden = imports(REPO)
    assert set(map(role, graph)) - {"__init__"} == set(LEVEL), "a role without a row in LAYERS, or a row with no role"
    assert not upward(graph), upward(graph)
    assert not circle(graph), circle(graph)
    assert not hidden, f"imports hidden in a function or under TYPE_CHECKING: {hidden}"
