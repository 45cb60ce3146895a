"""Does every symbol the patches change or rely on still exist, as they expect it, in a given vLLM?

Two checks over the registry (:mod:`patches.framework.registry`), both per target:

:func:`check_tree`
    reads a vLLM *source tree* without importing it (``ast``), so it works on
    any release, e.g. an unpacked newer sdist: the module, the class (through
    the module's imports and the class's bases), the function or attribute,
    the parameters the patch passes by position (``params``, in order, first
    after ``self``) and by name (``keywords``), the attributes it reads
    (``attrs``: methods, class attributes, or ``self.<name>`` assigned in any
    method of the class or its bases), for an ``env_default`` that vLLM
    still reads the variable (``vllm/envs.py``), and for a module-level name
    a patch relies on (``relies_on``) that the module still binds it.
:func:`check_installed`
    the same on the installed vLLM's sources, plus an import of every symbol
    and :func:`inspect.signature` of the original behind any wrapper.

Each finding lists what moved; an upgrade of vLLM starts from that list.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ._core import upstream_of
from .registry import Patch, Target


@dataclass
class TargetCheck:
    patch: str
    target: Target
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def signature_problems(target: Target, names: list[str], has_var_kw: bool = False) -> list[str]:
    """What ``target`` relies on that a parameter list (after ``self``) lacks."""
    problems = []
    if tuple(names[: len(target.params)]) != target.params:
        problems.append(
            f"parameters start ({', '.join(names[: len(target.params) + 1])}), the patch passes "
            f"({', '.join(target.params)}) by position"
        )
    missing = [k for k in target.keywords if k not in names]
    if missing:
        problems.append(
            f"no parameter {', '.join(missing)} (the patch uses it by name"
            + (", and the function takes **kwargs: check where it goes)" if has_var_kw else ")")
        )
    return problems


# --------------------------------------------------------------------------- a source tree, read with ast


def package_root(path: Path) -> Path:
    """The directory holding the ``vllm`` package: ``path`` itself, or its parent if ``path`` is the package."""
    path = Path(path)
    if (path / "vllm" / "__init__.py").is_file():
        return path
    if path.name == "vllm" and (path / "__init__.py").is_file():
        return path.parent
    raise FileNotFoundError(f"{path}: no vllm package there (expected {path / 'vllm' / '__init__.py'})")


@contextlib.contextmanager
def source_root(path: Path) -> Iterator[Path]:
    """:func:`package_root` of a directory, or of an sdist (``.tar.gz``: its ``vllm/*.py`` unpacked into a
    temporary directory, removed afterwards)."""
    path = Path(path)
    if not (path.is_file() and path.name.endswith((".tar.gz", ".tgz"))):
        yield package_root(path)
        return
    with tempfile.TemporaryDirectory(prefix="vllm-sdist-") as out, tarfile.open(path) as tar:
        members = [m for m in tar.getmembers() if "/vllm/" in f"/{m.name}" and m.name.endswith(".py")]
        tar.extractall(out, members=members, filter="data")
        roots = sorted({p.parent for p in Path(out).rglob("vllm/__init__.py")}, key=lambda p: len(p.parts))
        if not roots:
            raise FileNotFoundError(f"{path}: no vllm/__init__.py in it")
        yield roots[0]


@dataclass
class _Class:
    module: str
    node: ast.ClassDef


class SourceTree:
    """Modules, classes and their members of one source tree, parsed on demand."""

    def __init__(self, root: Path):
        self.root = package_root(root)
        self._modules: dict[str, ast.Module | None] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self._modules:
            base = self.root.joinpath(*name.split("."))
            path = next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)
            self._modules[name] = ast.parse(path.read_text(), str(path)) if path else None
        return self._modules[name]

    def _is_package(self, name: str) -> bool:
        return (self.root.joinpath(*name.split(".")) / "__init__.py").is_file()

    def _imported(self, module: str, name: str) -> tuple[str, str] | None:
        """Where ``name`` in ``module`` comes from: (module, name there), through ``from ... import``."""
        tree = self.module(module)
        for node in tree.body if tree else ():
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        package = module if self._is_package(module) else module.rpartition(".")[0]
                        for _ in range(max(node.level - 1, 0)):
                            package = package.rpartition(".")[0]
                        source = node.module or ""
                        if node.level:
                            source = f"{package}.{source}" if source else package
                        return source, alias.name
        return None

    def binds(self, module: str, name: str) -> bool:
        """``module`` has ``name``: found by :meth:`find`, imported there, or served by its ``__getattr__``
        (a module-level one that compares against the name)."""
        if self.find(module, name) is not None or self._imported(module, name) is not None:
            return True
        tree = self.module(module)
        if tree is None:
            return False
        getattr_ = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"), None)
        return getattr_ is not None and any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree))

    def find(self, module: str, name: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """A top-level class, function or assignment ``name`` of ``module``, through re-exports."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return module, node
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return module, node
        origin = self._imported(module, name)
        return self.find(*origin, depth=depth + 1) if origin else None

    def bases(self, cls: _Class) -> tuple[list[_Class], list[str]]:
        """The class's bases found in this tree, and the names of those that are not (e.g. ``torch.nn.Module``)."""
        found, outside = [], []
        for base in cls.node.bases:
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else None
            hit = self.find(cls.module, base.id) if isinstance(base, ast.Name) else None
            if hit and isinstance(hit[1], ast.ClassDef):
                found.append(_Class(hit[0], hit[1]))
            elif name:
                outside.append(ast.unparse(base))
        return found, outside

    def mro(self, cls: _Class) -> tuple[list[_Class], list[str]]:
        out: list[_Class] = []
        outside: list[str] = []
        todo = [cls]
        while todo:
            c = todo.pop(0)
            if any(c.node is o.node for o in out):
                continue
            out.append(c)
            found, more = self.bases(c)
            todo += found
            outside += more
        return out, outside

    @staticmethod
    def members(cls: _Class) -> dict[str, ast.AST]:
        """Names defined in the class body, and ``self.<name>`` assigned in any of its methods."""
        out: dict[str, ast.AST] = {}
        node: ast.AST
        for node in cls.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = node
            elif isinstance(node, ast.Assign):
                out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                out[node.target.id] = node
        for node in ast.walk(cls.node):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                else []
            )
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.setdefault(t.attr, node)
        return out

    def lookup(self, cls: _Class, name: str) -> tuple[_Class, ast.AST] | None:
        for c in self.mro(cls)[0]:
            hit = self.members(c).get(name)
            if hit is not None:
                return c, hit
        return None


def _abstract(node: ast.AST) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", "")) == "abstractmethod" for d in decorators)


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> tuple[list[str], bool]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    if method and not static:
        names = names[1:]
    return names + [p.arg for p in a.kwonlyargs], a.kwarg is not None


def check_target_in_tree(tree: SourceTree, target: Target) -> TargetCheck:
    f = TargetCheck("", target)
    module = tree.module(target.module)
    if module is None:
        f.problems.append(f"module {target.module} not found")
        return f
    if target.kind == "env_default":
        if not any(isinstance(n, ast.Constant) and n.value == target.attr for n in ast.walk(module)):
            f.problems.append(f"{target.module} no longer mentions {target.attr}")
        return f
    *path, name = target.qualname.split(".")
    if not path and target.kind == "relies_on":
        return _check_module_name(tree, target, f)
    if not path:  # a module-level function
        hit = tree.find(target.module, name)
        if hit is None or not isinstance(hit[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
            f.problems.append(f"no function {name} in {target.module}")
        else:
            f.problems += signature_problems(target, *_parameters(hit[1], method=False))
        return f
    hit = tree.find(target.module, path[0])
    if hit is None or not isinstance(hit[1], ast.ClassDef) or len(path) > 1:
        f.problems.append(f"no class {'.'.join(path)} in {target.module}")
        return f
    cls = _Class(hit[0], hit[1])
    if cls.module != target.module:
        f.notes.append(f"{path[0]} is defined in {cls.module}")
    found = tree.lookup(cls, name)
    if found is None:
        outside = tree.mro(cls)[1]
        f.problems.append(
            f"{path[0]} has no {name}" + (f" (bases outside vLLM not read: {', '.join(outside)})" if outside else "")
        )
    else:
        owner, node = found
        if owner.node is not cls.node:
            if _abstract(node):
                f.problems.append(f"{path[0]} has only the abstract {name} of {owner.node.name}: its own moved")
            f.notes.append(f"{name} inherited from {owner.node.name} ({owner.module})")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            f.problems += signature_problems(target, *_parameters(node, method=True))
        elif target.params or target.keywords:
            f.problems.append(f"{path[0]}.{name} is an attribute, not a function: the patch calls it")
        if target.optional and owner.node is not cls.node:
            f.notes.append("optional and not defined on the class itself: skipped")
    for attr in target.attrs:
        if tree.lookup(cls, attr) is None:
            f.problems.append(f"{path[0]} has no attribute {attr} (the patch reads it)")
    return f


def _check_module_name(tree: SourceTree, target: Target, f: TargetCheck) -> TargetCheck:
    """A module-level name a patch relies on: bound there (defined, assigned or imported; or served by the
    module's ``__getattr__``, which must mention it), and, for a class or function, what the patch uses of it."""
    name = target.qualname
    hit = tree.find(target.module, name)
    if hit is None:
        if tree.binds(target.module, name):
            return f
        f.problems.append(f"{target.module} binds no {name}")
        return f
    node = hit[1]
    if isinstance(node, ast.ClassDef):
        cls = _Class(hit[0], node)
        init = tree.lookup(cls, "__init__")
        if target.params or target.keywords:
            if init is not None and isinstance(init[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
                f.problems += signature_problems(target, *_parameters(init[1], method=True))
            else:  # a dataclass: its fields are its parameters
                fields = [k for k in target.keywords if tree.lookup(cls, k) is None]
                f.problems += [f"{name} has no field {k} (the patch passes it by name)" for k in fields]
        for attr in target.attrs:
            if tree.lookup(cls, attr) is None:
                f.problems.append(f"{name} has no attribute {attr} (the patch reads it)")
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        f.problems += signature_problems(target, *_parameters(node, method=False))
    return f


def check_tree(all_patches: dict[str, Patch], root: Path) -> list[TargetCheck]:
    """Every target of every patch against the vLLM source tree (or sdist) at ``root``; nothing imported from it."""
    out = []
    with source_root(root) as package_dir:
        tree = SourceTree(package_dir)
        for name, patch in all_patches.items():
            for target in patch.symbols:
                if target.module.split(".")[0] != "vllm":
                    # torch's (the decoder layers' base class): not in a vLLM tree; check_installed imports it
                    out.append(TargetCheck(name, target, notes=["not a vLLM symbol: checked where installed only"]))
                    continue
                finding = check_target_in_tree(tree, target)
                finding.patch = name
                if target.optional and finding.problems:
                    finding.notes += [f"absent, and optional: {p}" for p in finding.problems]
                    finding.problems = []
                out.append(finding)
    return out


# --------------------------------------------------------------------------- the installed vLLM, imported


def check_target_imported(target: Target) -> list[str]:
    """Import the symbol; where it is a function, check its signature (of the original, behind our wrappers)."""
    if target.kind == "env_default":
        import vllm.envs as envs

        return [] if target.attr in envs.environment_variables else [f"vllm.envs does not read {target.attr}"]
    try:
        owner = target.owner()
    except (ImportError, AttributeError) as e:
        return [f"cannot import {target.symbol}: {type(e).__name__}: {e}"]
    if target.kind == "relies_on" and "." not in target.qualname:  # a module-level name: the module has it
        return [] if hasattr(owner, target.attr) else [f"{target.module} has no {target.attr}"]
    if not hasattr(owner, target.attr):
        return []  # an instance attribute: only the source says
    fn = upstream_of(inspect.getattr_static(owner, target.attr))
    fn = getattr(fn, "__func__", fn)
    if not callable(fn) or isinstance(fn, type):
        return []
    params = list(inspect.signature(fn).parameters.values())
    if isinstance(owner, type) and not isinstance(inspect.getattr_static(owner, target.attr), staticmethod):
        params = params[1:]
    names = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return signature_problems(target, names, any(p.kind == p.VAR_KEYWORD for p in params))


def installed_root() -> Path:
    import vllm

    return Path(vllm.__file__).resolve().parent.parent


def check_installed(all_patches: dict[str, Patch]) -> list[TargetCheck]:
    """:func:`check_tree` on the installed vLLM's sources, plus every symbol imported and its signature read."""
    findings = check_tree(all_patches, installed_root())
    for f in findings:
        problems = check_target_imported(f.target)
        if f.target.optional and problems:
            f.notes += [f"absent, and optional: {p}" for p in problems]
        else:
            f.problems += [f"imported: {p}" for p in problems]
    return findings


def report(findings: list[TargetCheck]) -> str:
    bad = [f for f in findings if f.problems]
    lines = [
        (
            f"{len(findings) - len(bad)} of {len(findings)} symbols changed or relied on as the patches expect them; "
            f"{len(bad)} moved or changed"
        ),
        "",
    ]
    for f in findings:
        status = "MOVED" if f.problems else "ok"
        lines.append(f"{status:5}  {f.patch:11} {f.target.kind:11} {f.target.symbol}")
        lines += [f"         - {p}" for p in f.problems]
        lines += [f"         ({n})" for n in f.notes]
    return "\n".join(lines) + "\n"
