"""The registry of every patched vLLM symbol: complete, current, checkable against another vLLM, idempotent.

Fast (no engine): the checks read vLLM's sources and import its modules, nothing more.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import patches
from patches.framework import _core as fw
from patches.framework.registry import HEADER_SECTIONS, Patch, Target, index_markdown, parse_header
from patches.framework.registry import patches as all_patches
from patches.framework.upstream_check import check_installed, check_tree, installed_root, report

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def registry() -> dict[str, Patch]:
    return all_patches()


def test_every_patched_symbol_is_in_the_installed_vllm_as_the_patches_expect(registry):
    findings = check_installed(registry)
    assert len(findings) == sum(len(p.symbols) for p in registry.values())
    assert [f for f in findings if f.problems] == [], report(findings)


def test_the_docs_page_is_the_generated_index(registry):
    """docs/patches.md is `python -m patches --list`: it cannot drift from the declarations the code applies."""
    committed = (REPO / "docs" / "patches.md").read_text()
    assert committed == index_markdown(registry), "regenerate: python -m patches --list > docs/patches.md"
    for patch in registry.values():
        for t in patch.symbols:
            assert f"`{t.symbol}`" in committed


def test_every_patch_module_has_its_header(registry):
    assert list(registry) == list(patches.PATCH_MODULES)
    for name, patch in registry.items():
        assert patch.name == name, f"{patch.module}: the header's first line names patch {patch.name!r}"
        missing = [s for s in HEADER_SECTIONS if not patch.header.get(s)]
        assert not missing, f"{patch.module}: header sections missing: {missing}"
        for version in fw.VERIFIED_VLLM:
            assert version in patch.header["Verified on"], f"{patch.module}: not verified on {version}?"
        assert patch.targets, f"{patch.module} declares no target"


def test_run_time_targets_name_a_wrap_of_their_patch_that_applies_them(registry):
    for patch in registry.values():
        wraps = {t.symbol for t in patch.targets if t.kind == "wrap"}
        for t in patch.targets:
            if t.applied_by is not None:
                assert t.applied_by in wraps, f"{t.symbol}: applied by {t.applied_by}, not a wrap of {patch.name}"


def test_a_header_title_may_run_over_two_lines():
    doc = (
        '"""Patch ``x``: a thing.\n\nWhat it changes (only when\nconfigured)\n    one\n    two\n\nWhy\n    because\n"""'
    )
    assert parse_header(doc.strip('"')) == {"What it changes": "one two", "Why": "because"}


# --------------------------------------------------------------------------- every change goes through install()

FORBIDDEN_CALLS = {"install", "setattr", "wrap_method"}


def direct_changes(source: str) -> list[str]:
    """Places where a patch module would change vLLM without the registry: install()/setattr() calls, a
    ``__class__`` assignment, a write to the environment."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
            if name in FORBIDDEN_CALLS or (name == "setdefault" and "environ" in ast.unparse(fn)):
                found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if (isinstance(t, ast.Attribute) and t.attr == "__class__") or "environ" in ast.unparse(t):
                assert isinstance(node, ast.Assign)  # only an assignment has targets
                found.append(f"line {node.lineno}: {ast.unparse(node)[:80]}")
    return found


def test_patch_modules_change_vllm_only_through_their_registry_entries():
    for module in patches.PATCH_MODULES.values():
        path = REPO / (module.replace(".", "/") + ".py")
        assert direct_changes(path.read_text()) == [], f"{path}: change vLLM through a Target of PATCH"


def test_the_direct_change_check_can_fail():
    for bad in (
        "module.__class__ = Fuzzed",
        "wrap_method(A, 'f', g)",
        "install(A, 'f', g)",
        "os.environ.setdefault('X', '0')",
        "os.environ['X'] = '0'",
        "setattr(A, 'f', g)",
    ):
        assert direct_changes(bad), bad
    assert direct_changes("self.worker = w\nPATCH.target(X).apply_to(self)") == []


# --------------------------------------------------------------------------- against another vLLM source tree


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """The installed vLLM's sources as a tree of links (a stand-in for another release): edited per test."""
    root = tmp_path_factory.mktemp("vllm-tree")
    shutil.copytree(
        installed_root() / "vllm",
        root / "vllm",
        symlinks=True,
        copy_function=os.symlink,
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    return root


def edited(tree: Path, relpath: str, old: str, new: str) -> None:
    path = tree / "vllm" / relpath
    text = path.read_text()
    assert text.count(old) >= 1, f"{relpath}: {old!r} not found"
    path.unlink()  # the link, not the installed file
    path.write_text(text.replace(old, new))


def moved(findings) -> dict[str, list[str]]:
    return {f.target.symbol: f.problems for f in findings if f.problems}


# (file, text, its replacement, the symbol that must show as moved, what its problem must say)
EDITS = [
    (
        "v1/request.py",
        "cache_salt: str | None = None",
        "salt: str | None = None",
        "vllm.v1.request:Request.__init__",
        "no parameter cache_salt",
    ),
    (
        "v1/metrics/stats.py",
        "num_local_cached_tokens: int,\n        num_external_cached_tokens: int,",
        "num_external_cached_tokens: int,\n        num_local_cached_tokens: int,",
        "vllm.v1.metrics.stats:PrefillStats.set",
        "the patch passes (num_prompt_tokens, num_local_cached_tokens",
    ),
    (
        "distributed/device_communicators/shm_broadcast.py",
        "self.busy_loop_s",
        "self.spin_window_s",
        "vllm.distributed.device_communicators.shm_broadcast:SpinCondition.wait",
        "no attribute busy_loop_s",
    ),
    (
        "v1/core/sched/scheduler.py",
        "def make_stats(",
        "def make_scheduler_stats(",
        "vllm.v1.core.sched.scheduler:Scheduler.make_stats",
        "Scheduler has only the abstract make_stats",
    ),
    (
        "envs.py",
        '"VLLM_USE_V2_MODEL_RUNNER"',
        '"VLLM_USE_V3_MODEL_RUNNER"',
        "vllm.envs:VLLM_USE_V2_MODEL_RUNNER",
        "no longer mentions VLLM_USE_V2_MODEL_RUNNER",
    ),
    # what the patches rely on without changing it (patches/framework/vllm_internals.py)
    (
        "v1/kv_offload/cpu/gpu_worker.py",
        "def _fill_direct_ops(",
        "def _fill_direct_copy_ops(",
        "vllm.v1.kv_offload.cpu.gpu_worker:SingleDirectionOffloadingHandler._fill_direct_ops",
        "SingleDirectionOffloadingHandler has no _fill_direct_ops",
    ),
    (
        "v1/metrics/stats.py",
        "num_kv_fetch_reqs_by_stage:",
        "num_kv_fetch_reqs_per_stage:",
        "vllm.v1.metrics.stats:SchedulerStats",
        "no attribute num_kv_fetch_reqs_by_stage",
    ),
    (
        "v1/engine/utils.py",
        "from vllm.platforms import current_platform",
        "from vllm import platforms",
        "vllm.v1.engine.utils:current_platform",
        "vllm.v1.engine.utils binds no current_platform",
    ),
    (
        "utils/ompmultiprocessing.py",
        "rank: int, local_rank: int)",
        "rank: int, node_rank: int)",
        "vllm.utils.ompmultiprocessing:OMPProcessManager.configure_omp_envs",
        "no parameter local_rank",
    ),
    (
        "v1/kv_offload/base.py",
        "    transfer_time: float | None = None",
        "    elapsed: float | None = None",
        "vllm.v1.kv_offload.base:TransferResult",
        "has no field transfer_time",
    ),
]


def test_the_check_against_an_unchanged_tree_passes(registry, tree_copy):
    findings = check_tree(registry, tree_copy)
    assert moved(findings) == {}, report(findings)


@pytest.mark.parametrize("relpath, old, new, symbol, problem", EDITS, ids=[e[3].split(":")[1] for e in EDITS])
def test_the_check_against_a_changed_tree_names_what_moved(
    registry, tree_copy, tmp_path, relpath, old, new, symbol, problem
):
    tree = tmp_path / "tree"
    shutil.copytree(tree_copy, tree, symlinks=True)
    edited(tree, relpath, old, new)
    found = moved(check_tree(registry, tree))
    assert list(found) == [symbol], found
    assert any(problem in p for p in found[symbol]), found[symbol]


def test_a_module_that_moved_is_named(registry, tree_copy, tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(tree_copy, tree, symlinks=True)
    (tree / "vllm" / "v1" / "kv_offload" / "cpu" / "spec.py").unlink()
    found = moved(check_tree(registry, tree))
    assert found == {
        "vllm.v1.kv_offload.cpu.spec:CPUOffloadingSpec.get_worker": ["module vllm.v1.kv_offload.cpu.spec not found"]
    }


def test_the_command_line(tree_copy, tmp_path, capsys):
    """`python -m patches --check-against DIR`: exit 0 on the same vLLM, 1 naming the symbol when one moved."""
    from patches.__main__ import main

    assert main(["--check-against", str(tree_copy)]) == 0
    assert " 0 moved or changed" in capsys.readouterr().out
    tree = tmp_path / "tree"
    shutil.copytree(tree_copy, tree, symlinks=True)
    edited(tree, "v1/request.py", "cache_salt: str | None = None", "salt: str | None = None")
    changed = subprocess.run(
        [sys.executable, "-m", "patches", "--check-against", str(tree)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert changed.returncode == 1 and "MOVED  fuzz" in changed.stdout and "no parameter cache_salt" in changed.stdout


# --------------------------------------------------------------------------- idempotence, one way for every kind


@pytest.fixture
def upstream(monkeypatch):
    """A stand-in upstream module: a class with a method, a class-valued attribute, a helper object."""
    mod = types.ModuleType("fake_upstream")

    class Counter:
        def inc(self, amount=1):
            return amount

    class Engine:
        counter_cls = Counter

        def __init__(self):
            self.helper = types.SimpleNamespace(name="helper")

        def step(self, n):
            return n

        def forward(self, x):
            return x

    vars(mod).update(Counter=Counter, Engine=Engine)
    monkeypatch.setitem(sys.modules, "fake_upstream", mod)
    return mod


def doubled(original):
    def step(self, n):
        return 2 * original(self, n)

    return step


def doubled_bound(original):
    def step(n):
        return 2 * original(n)

    return step


def negated_class(cls):
    return type(f"Negated{cls.__name__}", (cls,), {"forward": lambda self, x: -cls.forward(self, x)})


def wrapped_helper(helper, tag):
    return types.SimpleNamespace(inner=helper, tag=tag)


def test_wrap_applies_once(upstream):
    t = Target("fake_upstream:Engine.step", "wrap", "test", make=doubled)
    assert t.apply() is True and t.apply() is False
    assert upstream.Engine().step(3) == 6


def test_rebind_applies_once_per_object_and_stacks_on_another_patch(upstream):
    Target("fake_upstream:Engine.step", "wrap", "test", make=doubled).apply()  # another patch, class-wide
    t = Target("fake_upstream:Engine.step", "rebind", "test", make=doubled_bound, applied_by="fake_upstream:x.y")
    engine = upstream.Engine()
    assert t.apply_to(engine) is True and t.apply_to(engine) is False
    assert engine.step(3) == 12, "both changes apply, each once"
    assert upstream.Engine().step(3) == 6, "the rebind is one object's"
    helper = Target(
        "fake_upstream:Engine.helper", "rebind", "test", make=wrapped_helper, applied_by="fake_upstream:x.y"
    )
    assert helper.apply_to(engine, "t1") is True and helper.apply_to(engine, "t2") is False
    assert engine.helper.tag == "t1" and engine.helper.inner.name == "helper"


def test_class_swap_applies_once(upstream):
    obj_swap = Target(
        "fake_upstream:Engine.forward",
        "class_swap",
        "test",
        make=negated_class,
        slot="__class__",
        applied_by="fake_upstream:x.y",
    )
    engine = upstream.Engine()
    assert obj_swap.apply_to(engine) is True and obj_swap.apply_to(engine) is False
    assert type(engine).__mro__[1] is upstream.Engine and engine.forward(2) == -2
    attr_swap = Target(
        "fake_upstream:Engine.counter_cls", "class_swap", "test", make=negated_class, applied_by="fake_upstream:x.y"
    )
    assert attr_swap.apply_to(engine) is True and attr_swap.apply_to(engine) is False
    # mypy took upstream.Engine for a plain `type` after the `is` above; it is the fixture's Engine class
    assert engine.counter_cls.__mro__[1] is upstream.Counter and upstream.Engine.counter_cls is upstream.Counter  # type: ignore[attr-defined]


def test_env_default_applies_once_and_a_users_value_wins(monkeypatch):
    monkeypatch.delenv("FUZZSERVE_TEST_DEFAULT", raising=False)
    t = Target("fake_upstream:FUZZSERVE_TEST_DEFAULT", "env_default", "test", value="0")
    assert t.apply() is True and os.environ["FUZZSERVE_TEST_DEFAULT"] == "0" and t.apply() is False
    monkeypatch.setenv("FUZZSERVE_TEST_DEFAULT", "1")
    assert t.apply() is False and os.environ["FUZZSERVE_TEST_DEFAULT"] == "1"


def test_a_relied_on_symbol_changes_nothing():
    t = Target("fake_upstream:Engine.helper", "relies_on", "test")
    with pytest.raises(TypeError, match="relied on"):
        t.apply()
    with pytest.raises(ValueError, match="relies_on changes nothing"):
        Target("a:b", "relies_on", "test", make=doubled)
    with pytest.raises(ValueError, match="relies_on"):
        Patch("Patch ``x``: y.", (t,))


def test_every_patch_relies_on_something_named_in_the_index(registry):
    """The relied-on table covers every patch, and docs/patches.md lists it (joined by registry.load)."""
    assert all(p.relies_on for p in registry.values()), {n for n, p in registry.items() if not p.relies_on}
    assert all(t.kind == "relies_on" for p in registry.values() for t in p.relies_on)


def undeclared(source: str, symbols: list[str]) -> list[str]:
    """The vLLM names a patch module imports that no symbol of its patch (changed or relied on) declares: a
    class or function (``vllm.x:Y``, or the owner of a declared ``vllm.x:Y.z``), or a module (``from vllm
    import envs``: some symbol of ``vllm.envs``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "vllm"):
            continue
        for alias in node.names:
            symbol, module = f"{node.module}:{alias.name}", f"{node.module}.{alias.name}"
            if not any(s == symbol or s.startswith(f"{symbol}.") or s.split(":")[0] == module for s in symbols):
                out.append(symbol)
    return out


def test_every_vllm_name_a_patch_imports_is_declared(registry):
    for patch in registry.values():
        source = (REPO / (patch.module.replace(".", "/") + ".py")).read_text()
        assert undeclared(source, [t.symbol for t in patch.symbols]) == [], (
            f"{patch.module}: declare it in patches/framework/vllm_internals.py (relies_on)"
        )


def test_an_undeclared_import_is_found():
    symbols = [
        "vllm.v1.kv_offload.base:TransferResult",
        "vllm.envs:VLLM_ENABLE_V1_MULTIPROCESSING",
        "vllm.utils.ompmultiprocessing:OMPProcessManager.__init__",
    ]
    assert undeclared(
        "def f():\n    from vllm.v1.kv_offload.base import TransferResult, OffloadingWorker\n"
        "    from vllm import envs\n    from vllm.utils.ompmultiprocessing import OMPProcessManager\n",
        symbols,
    ) == ["vllm.v1.kv_offload.base:OffloadingWorker"]


def test_a_target_is_checked_when_declared():
    with pytest.raises(ValueError, match="kind"):
        Target("a:b", "monkeypatch", "test", make=doubled)  # type: ignore[arg-type]  # an unknown kind on purpose
    with pytest.raises(ValueError, match=r"module:Qualified.name"):
        Target("a.b", "wrap", "test", make=doubled)
    with pytest.raises(ValueError, match="name the wrap"):
        Target("a:b", "rebind", "test", make=doubled)
    with pytest.raises(ValueError, match="env_default"):
        Target("a:B", "env_default", "test", make=doubled)
