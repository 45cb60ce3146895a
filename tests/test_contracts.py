"""One place per contract: every name that two parts of the project must agree on is spelled in one module only.

A contract here is a string that another program reads or writes (an
environment variable, a metric name, a Ray actor name): typed twice, the two
copies drift apart silently. Each is defined in its home module and imported
everywhere else, scripts included (``scripts/env.sh`` evaluates
``python -m serve_app.engine.cluster_env``). This test reads every Python file of
the project (a string constant equal to a contract, docstrings aside) and
every script (a contract's variable name outside comments), and fails on a
copy outside the home module. Prose that mentions a name inside a longer
message is not a copy. ``scripts/bootstrap.sh`` is not read: it runs before
the project's environment exists, and its text keys the virtual environment.

Data files that other tools read (``serve_config.yaml``'s ``runtime_env``, the
Prometheus rules) cannot import; their own tests compare them with the home
module (tests/test_serve_config.py, tests/test_monitoring_rules.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from fixture_model import build
from patches import early_submit, inline_render, shm_wait, stats_thread
from patches.framework import switches
from serve_app.config import names
from serve_app.engine import cluster_env, engine_env
from serve_app.observability import contract as observability
from serve_app.observability import fuzz_traffic

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("patches", "serve_app", "load_tests", "monitoring", "fixture_model", "testkit", "benchmarks", "tests")
# home module -> the contracts it defines
CONTRACTS: dict[str, tuple[str, ...]] = {
    "patches/framework/switches.py": (switches.OFF_ENV, switches.ALLOW_UNVERIFIED_ENV),
    "patches/shm_wait.py": (shm_wait.NAP_ENV,),
    "patches/stats_thread.py": (stats_thread.ENABLE_ENV,),
    "patches/inline_render.py": (inline_render.MAX_CHARS_ENV,),
    "patches/early_submit.py": (early_submit.ENABLE_ENV,),
    "serve_app/engine/cluster_env.py": (
        cluster_env.HAPROXY,
        cluster_env.FORWARD_BODY,
        cluster_env.AUTH_MODE,
        cluster_env.AUTH_TOKEN,
        cluster_env.AUTH_TOKEN_PATH,
        "get-auth-token",
    ),
    "serve_app/engine/engine_env.py": (engine_env.HF_HUB_OFFLINE, engine_env.KV_CACHE_SPACE),
    "serve_app/config/names.py": (names.REPLICA_CLASS_PREFIX, names.ENGINE_REPLICA_CLASS, names.PROCESS_TITLE_PREFIX),
    "serve_app/observability/fuzz_traffic.py": (fuzz_traffic.METRIC, fuzz_traffic.EXPORTED),
    "serve_app/observability/contract.py": (observability.HEALTH_GAUGE, observability.HEALTH_CHECK_FAILURES),
    "fixture_model/build.py": (build.CACHE_ENV,),
}
HOME = {value: home for home, values in CONTRACTS.items() for value in values}
# Reading a replica's id out of its actor name (``rsplit("#")``) is a contract too: serve_app.config.names.replica_id.
REPLICA_ID_HOME = "serve_app/config/names.py"
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]+$")
# This file plants copies on purpose, to show that the check finds them.
SELF = "tests/test_contracts.py"


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def spelled(source: str, path: str) -> list[str]:
    """The contracts ``source`` (the file ``path``, relative to the repository) spells outside their home."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            home = HOME.get(node.value)
            if home is not None and home != path:
                found.append(node.value)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "rsplit"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "#"
            and path != REPLICA_ID_HOME
        ):
            found.append('rsplit("#")')
    return found


def spelled_in_script(text: str) -> list[str]:
    """The contract variables a shell script names outside comments."""
    found = []
    for line in text.splitlines():
        code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
        found += [value for value in HOME if ENV_NAME.match(value) and re.search(rf"\b{value}\b", code)]
    return found


def copies(root: Path) -> dict[str, list[str]]:
    """Every file under ``root`` that spells a contract outside its home, with what it spells."""
    out = {}
    for package in PACKAGES:
        for f in sorted((root / package).rglob("*.py")):
            rel = str(f.relative_to(root))
            if rel != SELF and (found := spelled(f.read_text(), rel)):
                out[rel] = found
    for f in sorted((root / "scripts").glob("*.sh")):
        if f.name != "bootstrap.sh" and (found := spelled_in_script(f.read_text())):
            out[str(f.relative_to(root))] = found
    return out


def test_every_contract_has_one_home():
    assert len(HOME) == sum(len(v) for v in CONTRACTS.values()), "a contract listed under two homes"
    for home, values in CONTRACTS.items():
        text = (REPO / home).read_text()
        assert all(v in text for v in values if v != names.ENGINE_REPLICA_CLASS), home


@pytest.mark.parametrize(
    "source, want",
    [
        ('env = {"FUZZSERVE_PATCHES_OFF": "all"}', ["FUZZSERVE_PATCHES_OFF"]),
        ('os.environ.setdefault("HF_HUB_OFFLINE", "1")', ["HF_HUB_OFFLINE"]),
        ('def f():\n    return cluster.actors("ServeReplica:")', ["ServeReplica:"]),
        ('rid = actor["name"].rsplit("#", 1)[-1]', ['rsplit("#")']),
        ('q = "ray_serve_deployment_replica_healthy"', ["ray_serve_deployment_replica_healthy"]),
        ('subprocess.run(["ray", "get-auth-token", "--generate"])', ["get-auth-token"]),
    ],
)
def test_a_planted_copy_is_found(source, want):
    assert spelled(source, "load_tests/cli.py") == want


@pytest.mark.parametrize(
    "source",
    [
        '"""Set FUZZSERVE_PATCHES_OFF before ray start."""\nfrom patches.framework.switches import OFF_ENV\nenv = {OFF_ENV: "all"}',  # noqa: E501
        'msg = "switch it off with FUZZSERVE_PATCHES_OFF=fuzz"',  # prose naming it
        'parts = "a:b".rsplit(":", 1)',
    ],
)
def test_imports_and_prose_are_not_copies(source):
    assert spelled(source, "load_tests/cli.py") == []


def test_the_home_may_spell_it():
    assert spelled('OFF_ENV = "FUZZSERVE_PATCHES_OFF"', "patches/framework/switches.py") == []
    assert spelled('OFF_ENV = "FUZZSERVE_PATCHES_OFF"', "patches/framework/_core.py") == ["FUZZSERVE_PATCHES_OFF"]


def test_scripts_are_read_too():
    assert spelled_in_script("# HF_HUB_OFFLINE is set below\nexport HF_HUB_OFFLINE=1\n") == ["HF_HUB_OFFLINE"]
    assert spelled_in_script("# HF_HUB_OFFLINE comes from python -m serve_app.engine.cluster_env\n") == []


def test_a_planted_class_of_the_same_name_is_found(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "load_tests" / "a.py").write_text("class Target:\n    pass\n")
    (tmp_path / "benchmarks" / "b.py").write_text("def f():\n    class Target:\n        pass\n")
    assert class_names(tmp_path)["Target"] == ["load_tests/a.py", "benchmarks/b.py"]


def test_a_planted_copy_in_a_tree_is_found(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "benchmarks" / "ok.py").write_text(
        "from patches.framework.switches import ALL, OFF_ENV\nenv = {OFF_ENV: ALL}\n"
    )
    (tmp_path / "benchmarks" / "bad.py").write_text('env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}\n')
    (tmp_path / "scripts" / "env.sh").write_text("export RAY_AUTH_MODE=token\n")
    assert copies(tmp_path) == {"benchmarks/bad.py": ["RAY_SERVE_ENABLE_HA_PROXY"], "scripts/env.sh": ["RAY_AUTH_MODE"]}


def test_no_file_spells_a_contract_outside_its_home():
    assert not copies(REPO), copies(REPO)


def class_names(root: Path) -> dict[str, list[str]]:
    """Class name -> the files of the shipped packages, testkit and benchmarks that define a class so named."""
    out: dict[str, list[str]] = {}
    for package in PACKAGES[:-1]:
        for f in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append(str(f.relative_to(root)))
    return out


def test_one_name_one_class():
    """A name means one thing (the load test's target, a benchmark's serving stack and a patched symbol were
    all ``Target``; a scrape's exception and its summary record both ``ScrapeError``)."""
    shared = {name: files for name, files in class_names(REPO).items() if len(files) > 1}
    assert not shared, shared
