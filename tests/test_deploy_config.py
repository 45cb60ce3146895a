"""The typed Serve config (serve_app.config.deploy_config): lossless loading, each change function fed its good and bad
cases, the load tests' deployed YAML unchanged for every scenario, and no module elsewhere editing the file's keys
by hand. Pure: nothing is started.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import functools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

import pytest
import yaml
from pydantic import ValidationError

from benchmarks.harness import targets
from patches.framework.switches import ALL, OFF_ENV
from serve_app.config import deploy_config as dc
from serve_app.config.deploy_config import BUILDER, Application, FuzzServeArgs, LLMSpec, ServeConfig, to_document

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("serve_config.yaml", "serve_config.cuda.yaml")
T = TypeVar("T")


def raw(name: str = "serve_config.yaml") -> dict:
    return yaml.safe_load((REPO / name).read_text())


def shipped() -> ServeConfig:
    return dc.load(REPO / "serve_config.yaml")


def stock_app(name: str = "b") -> Application:
    return Application(
        name=name,
        route_prefix=f"/{name}",
        import_path="ray.serve.llm:build_openai_app",
        args={"llm_configs": [{"model_loading_config": {"model_id": "m"}}]},
    )


def two_apps() -> ServeConfig:
    """The shipped app beside a stock ray.serve.llm one (what the benchmarks deploy side by side)."""
    return dc.with_applications(shipped(), [*shipped().applications, stock_app()])


def unchanged(cfg: ServeConfig, change: Callable[[ServeConfig], T]) -> T:
    """``change(cfg)``, asserting that ``cfg`` itself did not change."""
    before = copy.deepcopy(to_document(cfg))
    out = change(cfg)
    assert to_document(cfg) == before, "a change function changed its input"
    return out


# ----------------------------------------------------------------------------- load and dump


@pytest.mark.parametrize("name", CONFIGS)
def test_the_shipped_configs_round_trip_key_for_key(name):
    cfg = dc.load(REPO / name)
    assert to_document(cfg) == raw(name)
    assert yaml.safe_load(dc.to_yaml(cfg)) == raw(name)
    assert dc._first_difference(raw(name), to_document(cfg)) is None  # types too (True is not 1)
    [app] = cfg.applications
    assert isinstance(app.args, FuzzServeArgs) and all(isinstance(c, LLMSpec) for c in app.args.llm_configs)
    assert dc.parse(to_document(cfg)) == cfg


def test_every_field_of_an_llm_config_is_kept_even_ones_not_modelled():
    doc = raw()
    llm = doc["applications"][0]["args"]["llm_configs"][0]
    llm["lora_config"] = {"max_num_adapters_per_replica": 2}
    llm["model_loading_config"]["tokenizer_source"] = "x"
    llm["deployment_config"]["ray_actor_options"] = {"num_cpus": 1}
    assert to_document(dc.parse(doc)) == doc


@pytest.mark.parametrize(
    "where, edit",
    [
        ("top level", lambda d: d.update(bogus=1)),
        ("application", lambda d: d["applications"][0].update(bogus=1)),
        ("http_options", lambda d: d["http_options"].update(bogus=1)),
        ("deployments entry", lambda d: d["applications"][0].update(deployments=[{"name": "x", "bogus": 1}])),
    ],
)
def test_a_key_serves_schema_would_drop_is_refused_not_lost(where, edit):
    doc = raw()
    edit(doc)
    with pytest.raises(ValueError, match="bogus: not a field"):
        dc.parse(doc)
    good = raw()  # the good twin of each: the file itself
    assert to_document(dc.parse(good)) == good


def test_the_builder_args_are_validated_as_ours():
    doc = raw()
    doc["applications"][0]["args"]["gaurd"] = {}
    with pytest.raises(ValidationError, match="gaurd"):
        dc.parse(doc)
    doc = raw()
    doc["applications"][0]["args"]["routing"] = "random"
    with pytest.raises(ValidationError, match="routing"):
        dc.parse(doc)


def test_args_are_typed_only_for_this_projects_builder():
    app = stock_app()
    assert isinstance(app.args, dict) and app.args == {"llm_configs": [{"model_loading_config": {"model_id": "m"}}]}
    with pytest.raises(ValueError, match=r"not serve_app.app:build_app"):
        _ = app.fuzz_args
    with pytest.raises(ValidationError, match="mapping"):
        Application(name="b", route_prefix="/b", import_path="x:y", args=["not", "a", "mapping"])
    ours = Application(name="f", route_prefix="/f", import_path=BUILDER, args={"llm_configs": [{}]})
    assert isinstance(ours.args, FuzzServeArgs)


# ----------------------------------------------------------------------------- reading


def test_readers():
    cfg = two_apps()
    assert dc.application(cfg).name == "fuzzserve" and dc.application(cfg, "b").name == "b"
    with pytest.raises(KeyError, match="no application 'c'"):
        dc.application(cfg, "c")
    with pytest.raises(ValueError, match="no applications"):
        dc.application(dc.only_applications(cfg, ()))
    assert dc.first_llm(cfg).model_id == "fixture"
    assert [a.name for a in dc.fuzz_applications(cfg)] == ["fuzzserve"]
    assert dc.http_port(cfg) == 8000
    assert dc.http_port(dc.parse({"applications": []})) == dc.DEFAULT_HTTP_PORT
    assert dc.engine_deployment_names(cfg) == ["LLMServer:fixture"]
    assert dc.application(cfg).env_vars == raw()["applications"][0]["runtime_env"]["env_vars"]
    assert dc.request_router_kwarg(cfg, "prefix_chars") is None
    routed = dc.with_request_router_kwargs(cfg, {"prefix_chars": 128})
    assert dc.request_router_kwarg(routed, "prefix_chars") == 128


# ----------------------------------------------------------------------------- changes


def test_engine_kwargs_change_every_engine_of_our_builder_and_nothing_else():
    cfg = two_apps()
    seen = []

    def change(kw):
        seen.append(kw)
        kw["max_num_seqs"] = 4  # a change function may mutate what it is given: it is a copy
        return kw

    new = unchanged(cfg, lambda c: dc.with_engine_kwargs(c, change))
    assert dc.first_llm(new).engine_kwargs == {**dc.first_llm(cfg).engine_kwargs, "max_num_seqs": 4}
    assert seen[0] is not dc.first_llm(cfg).engine_kwargs
    assert dc.application(new, "b") == dc.application(cfg, "b"), "another builder's app is not ours to change"
    merged = unchanged(cfg, lambda c: dc.with_engine_kwargs_merged(c, {"enforce_eager": True}))
    assert dc.first_llm(merged).engine_kwargs["enforce_eager"] is True
    dropped = unchanged(cfg, lambda c: dc.without_engine_kwargs(c, ["kv_offloading_size", "not_there"]))
    assert "kv_offloading_size" not in dc.first_llm(dropped).engine_kwargs
    assert set(dc.first_llm(cfg).engine_kwargs) - set(dc.first_llm(dropped).engine_kwargs) == {"kv_offloading_size"}
    with pytest.raises(ValidationError):  # engine_kwargs are a mapping
        dc.with_engine_kwargs(cfg, lambda kw: ["max_num_seqs"])  # type: ignore[arg-type, return-value]  # on purpose


def test_allowed_xargs_are_appended_once_in_order():
    cfg = shipped()
    assert dc.with_allowed_xargs(cfg, ()) is cfg
    new = unchanged(cfg, lambda c: dc.with_allowed_xargs(c, ["a", "b", "a"]))
    assert dc.application(new).fuzz_args.guard.xargs.allowed_extra_keys == ("a", "b")
    again = dc.with_allowed_xargs(new, ["b", "c"])
    assert dc.application(again).fuzz_args.guard.xargs.allowed_extra_keys == ("a", "b", "c")
    # written where there was no guard.xargs before, as the redeploy wrote it
    bare = dc.parse({"applications": [{"name": "f", "import_path": BUILDER, "args": {"llm_configs": [{}]}}]})
    assert to_document(dc.with_allowed_xargs(bare, ["k"]))["applications"][0]["args"]["guard"] == {
        "xargs": {"allowed_extra_keys": ["k"]}
    }


def test_a_redeploy_merges_engine_settings_and_allows_keys():
    cfg = shipped()
    new = unchanged(cfg, lambda c: dc.redeployed(c, {"kv_offloading_size": 0.2}, ["fuzzserve_probe"]))
    assert dc.first_llm(new).engine_kwargs == {**dc.first_llm(cfg).engine_kwargs, "kv_offloading_size": 0.2}
    assert dc.application(new).fuzz_args.guard.xargs.allowed_extra_keys == ("fuzzserve_probe",)
    assert to_document(dc.redeployed(cfg, {})) == to_document(cfg), "an empty redeploy changes nothing"


def test_routing_and_replicas():
    cfg = shipped()
    assert dc.with_routing(cfg, None) is cfg
    assert (
        dc.application(unchanged(cfg, lambda c: dc.with_routing(c, "round_robin"))).fuzz_args.routing == "round_robin"
    )
    with pytest.raises(ValidationError, match="routing"):
        dc.with_routing(cfg, "random")  # type: ignore[arg-type]
    counts: tuple[int | Literal["fit"] | None, ...] = (3, "fit", None)
    for n in counts:
        changed = unchanged(cfg, functools.partial(dc.with_engine_replicas, replicas=n))
        assert dc.application(changed).fuzz_args.engine_replicas == n
    with pytest.raises(ValidationError, match="engine_replicas"):
        dc.with_engine_replicas(cfg, "all")  # type: ignore[arg-type]


def test_autoscaling_takes_the_replica_count_out_of_engine_replicas():
    cfg = shipped()
    new = unchanged(cfg, lambda c: dc.with_autoscaling(c, {"min_replicas": 1, "max_replicas": 2}))
    assert dc.application(new).fuzz_args.engine_replicas is None
    options = dc.first_llm(new).deployment_config
    assert options.autoscaling_config == {"min_replicas": 1, "max_replicas": 2}
    assert options.graceful_shutdown_timeout_s == 60, "the rest of deployment_config kept"  # type: ignore[attr-defined]
    assert options.max_replicas() == 2
    with pytest.raises(ValidationError):
        dc.with_autoscaling(cfg, "two")  # type: ignore[arg-type]


def test_a_scale_sets_num_replicas_in_the_deployments_section_only():
    cfg = dc.parse(
        {
            **raw(),
            "applications": [
                {
                    **raw()["applications"][0],
                    "deployments": [
                        {"name": "Other", "num_replicas": 5},
                        {"name": "LLMServer:fixture", "max_ongoing_requests": 7},
                    ],
                }
            ],
        }
    )
    new = unchanged(cfg, lambda c: dc.scaled(c, 3))
    assert new.applications[0].args == cfg.applications[0].args, "args unchanged: no replica restarts"
    assert to_document(new)["applications"][0]["deployments"] == [
        {"name": "Other", "num_replicas": 5},
        {"name": "LLMServer:fixture", "max_ongoing_requests": 7, "num_replicas": 3},
    ]
    fresh = dc.scaled(shipped(), 4)
    assert to_document(fresh)["applications"][0]["deployments"] == [{"name": "LLMServer:fixture", "num_replicas": 4}]
    assert to_document(dc.scaled(fresh, 1))["applications"][0]["deployments"] == [
        {"name": "LLMServer:fixture", "num_replicas": 1}
    ]
    with pytest.raises(ValidationError):
        dc.scaled(cfg, 0)
    with pytest.raises(ValidationError):
        dc.scaled(shipped(), -1)


def test_http_port_proxy_and_builder_args():
    cfg = shipped()
    moved = unchanged(cfg, lambda c: dc.with_http_port(c, 8123))
    assert dc.http_port(moved) == 8123 and to_document(moved)["http_options"]["host"] == "127.0.0.1"
    assert to_document(dc.with_http_port(cfg, None)) == to_document(cfg)
    bare = dc.parse({"applications": []})
    assert to_document(dc.with_http_port(bare, None)) == {"http_options": {}, "applications": []}
    with pytest.raises(ValidationError):
        dc.with_http_port(cfg, "eighty")  # type: ignore[arg-type]
    assert to_document(unchanged(cfg, dc.with_head_only_proxy))["proxy_location"] == "HeadOnly"
    cuda = dc.load(REPO / "serve_config.cuda.yaml")
    assert to_document(dc.with_head_only_proxy(cuda))["proxy_location"] == "HeadOnly"
    merged = unchanged(cfg, lambda c: dc.with_builder_args(c, {"guard": {"limits": {"max_n": 2}}, "shm_wait": False}))
    args = dc.application(merged).fuzz_args
    assert args.guard.limits.max_n == 2 and args.shm_wait is False
    assert args.guard.limits.max_batch == dc.application(cfg).fuzz_args.guard.limits.max_batch, "merged, not replaced"
    assert dc.with_builder_args(cfg, {}) is cfg
    with pytest.raises(ValidationError, match="gaurd"):
        dc.with_builder_args(cfg, {"gaurd": {}})


def test_env_applications_and_names():
    cfg = two_apps()
    env = unchanged(cfg, lambda c: dc.with_env(c, {OFF_ENV: ALL}, app_name="b"))
    assert dc.application(env, "b").env_vars == {OFF_ENV: ALL}
    assert dc.application(env).env_vars == dc.application(cfg).env_vars
    everywhere = dc.with_env(cfg, {"X": "1"})
    assert all(a.env_vars["X"] == "1" for a in everywhere.applications)
    assert dc.with_env(cfg, {}) is cfg
    assert [a.name for a in unchanged(cfg, lambda c: dc.only_applications(c, {"b"})).applications] == ["b"]
    with pytest.raises(ValidationError, match="route prefix"):
        dc.with_applications(cfg, [stock_app("b"), dc.renamed(stock_app("c"), "c", route_prefix="/b")])
    assert dc.renamed(stock_app(), "z").route_prefix == "/z"


def test_a_benchmark_target_is_the_shipped_app_with_only_the_named_changes():
    cfg = shipped()
    app = unchanged(cfg, lambda c: targets.benchmark_app(c, "S", 2))
    base = dc.application(cfg)
    assert (app.name, app.route_prefix) == ("S", "/S")
    assert base.fuzz_args.engine_replicas == "fit" and app.fuzz_args.engine_replicas == 2
    doc = {k: v for k, v in targets.to_document_app(app).items() if k not in ("name", "route_prefix")}
    want = copy.deepcopy({k: v for k, v in raw()["applications"][0].items() if k not in ("name", "route_prefix")})
    want["args"]["engine_replicas"] = 2
    assert doc == want
    tuned = targets.benchmark_app(
        cfg,
        "Sb",
        2,
        args={"routing": "round_robin"},
        engine_kwargs={"enforce_eager": True},
        env={"X": "1"},
        logging_config={"enable_access_log": False},
        router_kwargs={"imbalanced_threshold": 4},
    )
    assert tuned.fuzz_args.routing == "round_robin" and tuned.fuzz_args.llm_configs[0].engine_kwargs["enforce_eager"]
    assert (
        tuned.env_vars["X"] == "1"
        and tuned.logging_config is not None
        and tuned.logging_config.enable_access_log is False
    )
    router = tuned.fuzz_args.llm_configs[0].deployment_config.request_router_config
    assert router is not None and router["request_router_kwargs"] == {"imbalanced_threshold": 4}
    assert router["request_router_class"].endswith("RoundRobinRouter"), "the router the args name"
    with pytest.raises(ValueError, match="single-application"):
        targets.benchmark_app(two_apps(), "x", 1)
    bench = targets.benchmark_config([app, stock_app()])
    assert to_document(bench)["http_options"] == {"host": "127.0.0.1", "port": 8000, "request_timeout_s": 600.0}


def test_the_ingress_options_take_a_replica_count_instead_of_autoscaling():
    defaults = {"autoscaling_config": {"min_replicas": 1}, "ray_actor_options": {"num_cpus": 1}}
    assert dc.ingress_deployment_options(defaults, {"num_replicas": 2}) == {
        "ray_actor_options": {"num_cpus": 1},
        "num_replicas": 2,
    }
    assert dc.ingress_deployment_options(defaults, {"ray_actor_options": {"memory": 1}}) == {
        "autoscaling_config": {"min_replicas": 1},
        "ray_actor_options": {"num_cpus": 1, "memory": 1},
    }
    assert defaults == {"autoscaling_config": {"min_replicas": 1}, "ray_actor_options": {"num_cpus": 1}}


def test_deep_merged_copies():
    base = {"a": {"b": 1, "c": [1]}}
    out = dc.deep_merged(base, {"a": {"b": 2}, "d": 3})
    assert out == {"a": {"b": 2, "c": [1]}, "d": 3} and base == {"a": {"b": 1, "c": [1]}}
    out["a"]["c"].append(2)
    assert base["a"]["c"] == [1]


# ----------------------------------------------------------------------------- the load tests' YAML, unchanged
# The hand-editing functions as they were before the typed config (a6c105c: load_tests.operate.deploy.scenario_config,
# load_tests.operate.serve_config.redeployed_config / scaled_config, LocalCluster.effective_config), kept here as the
# reference the typed functions must agree with. Their output was also snapshot for every scenario, three deploy
# settings and both shipped configs before the change; the typed functions gave the same documents for all 78.


def _old_deep_update(base, new):
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _old_deep_update(base[k], v)
        else:
            base[k] = copy.deepcopy(v)
    return base


def _old_scenario_config(cfg, sc, settings):
    for app in cfg["applications"]:
        for llm in app["args"]["llm_configs"]:
            llm["engine_kwargs"] = sc.engine_overrides(llm.get("engine_kwargs", {}))
        if settings.routing:
            app["args"]["routing"] = settings.routing
        app["args"]["engine_replicas"] = settings.replicas
        if sc.autoscaling is not None:
            app["args"]["engine_replicas"] = None
            for llm in app["args"]["llm_configs"]:
                llm.setdefault("deployment_config", {})["autoscaling_config"] = dict(sc.autoscaling)
    return cfg


def _old_effective_config(workers, config, http_port=None):
    cfg = copy.deepcopy(config)
    cfg.setdefault("http_options", {})
    if http_port is not None:
        cfg["http_options"]["port"] = http_port
    if workers:
        cfg["proxy_location"] = "HeadOnly"
    return cfg


def _old_redeployed_config(cfg, step):
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        args = app.setdefault("args", {})
        for llm in args.get("llm_configs", []):
            llm.setdefault("engine_kwargs", {}).update(copy.deepcopy(step.engine_kwargs))
        if step.allow_xargs:
            xargs = args.setdefault("guard", {}).setdefault("xargs", {})
            xargs["allowed_extra_keys"] = [
                *xargs.get("allowed_extra_keys", []),
                *(k for k in step.allow_xargs if k not in xargs.get("allowed_extra_keys", [])),
            ]
    return new


def _old_scaled_config(cfg, replicas):
    new = copy.deepcopy(cfg)
    for app in new["applications"]:
        deployments = app.setdefault("deployments", [])
        for llm in app.get("args", {}).get("llm_configs", []):
            name = "LLMServer:" + llm["model_loading_config"]["model_id"]
            entry = next((d for d in deployments if d.get("name") == name), None)
            if entry is None:
                deployments.append(entry := {"name": name})
            entry["num_replicas"] = replicas
    return new


def _old_files(config_name, sc, settings) -> dict[str, dict]:
    from load_tests.plan.steps import Redeploy, Scale

    workers = sc.cluster.workers if sc.cluster else 0
    cur = _old_effective_config(workers, _old_scenario_config(raw(config_name), sc, settings), settings.http_port)
    files = {"effective": cur}
    for step in sc.operations.steps if sc.operations else ():
        if isinstance(step, Redeploy):
            cur = files[f"redeploy-{len(files)}"] = _old_redeployed_config(cur, step)
        elif isinstance(step, Scale):
            cur = files[f"scale-{step.replicas}"] = _old_scaled_config(cur, step.replicas)
    return files


class _RecordingCluster:
    """What the deploy and the operation steps hand a local cluster, recorded as the YAML files it would write."""

    def __init__(self, workers: int):
        from load_tests.operate.local_cluster import LocalCluster

        self.rig = LocalCluster(workers=workers)  # a dataclass: nothing starts until start()
        self.files: dict[str, dict] = {}

    def deploy(self, cfg, http_port=None):
        self.apply(self.rig.effective_config(cfg, http_port=http_port), "effective")

    def apply(self, cfg, name):
        self.files[name] = yaml.safe_load(dc.to_yaml(cfg))
        self.deployed_config = cfg


def _new_files(config_name, sc, settings) -> dict[str, dict]:
    """The YAML the load tests write for ``sc``: the deploy's effective config, then each step's, through the same
    functions the CLI runs (load_tests.operate.deploy.scenario_config, the steps' perform)."""
    from load_tests.operate.deploy import scenario_config
    from load_tests.operate.steps import Deployment, step_of

    cluster = _RecordingCluster(sc.cluster.workers if sc.cluster else 0)
    cluster.deploy(scenario_config(dc.load(REPO / config_name), sc, settings), http_port=settings.http_port)
    d = Deployment(cluster, checker=types.SimpleNamespace(), config=cluster.deployed_config)  # type: ignore[arg-type]
    for step in sc.operations.steps if sc.operations else ():
        if step.kind in ("redeploy", "scale"):
            asyncio.run(step_of(step).perform(d, 0.0, []))
    return cluster.files


def _settings():
    from load_tests.operate.deploy import DeploySettings

    return {
        "default": DeploySettings(),
        "fit, round robin, port": DeploySettings(replicas="fit", routing="round_robin", http_port=8123),
        "three": DeploySettings(replicas=3),
    }


def _scenario_names():
    from load_tests.plan.scenarios import SCENARIOS

    return sorted(SCENARIOS)


@pytest.mark.parametrize("scenario", _scenario_names())
def test_the_deployed_yaml_is_what_the_hand_edits_wrote(scenario):
    from load_tests.plan.scenarios import SCENARIOS

    sc = SCENARIOS[scenario]
    for config_name in CONFIGS:
        for label, settings in _settings().items():
            old, new = _old_files(config_name, sc, settings), _new_files(config_name, sc, settings)
            assert set(old) == set(new), (config_name, label)
            for name in old:
                assert new[name] == old[name], (config_name, label, name, dc._first_difference(old[name], new[name]))
                assert dc._first_difference(old[name], new[name]) is None, (config_name, label, name)


# ----------------------------------------------------------------------------- nobody else edits the file's keys

# The Serve config file's own keys (and its args'). A subscript, .get, .setdefault or .pop with one of them outside
# serve_app/config/deploy_config.py is a hand edit of the file, which the config's functions exist to replace.
SERVE_KEYS = frozenset(
    {
        "applications",
        "deployments",
        "llm_configs",
        "engine_kwargs",
        "num_replicas",
        "http_options",
        "runtime_env",
        "args",
        "env_vars",
        "proxy_location",
        "route_prefix",
        "import_path",
        "deployment_config",
        "model_loading_config",
        "autoscaling_config",
        "request_router_config",
    }
)
SCANNED = ("serve_app", "load_tests", "benchmarks", "testkit")
HOME = Path("serve_app/config/deploy_config.py")
# Documents that are not the config file but share a key name with it: (module, key) -> what it reads.
NOT_THE_CONFIG = {
    (Path("load_tests/operate/local_cluster.py"), "applications"): "`serve status` output",
    (Path("load_tests/operate/operator.py"), "applications"): "`serve status` output",
    (Path("load_tests/operate/operator.py"), "deployments"): "`serve status` output",
    (Path("benchmarks/routing_hits.py"), "args"): "its results document's record of its command-line arguments",
}


def hand_edits(source: str) -> list[tuple[int, str]]:
    """(line, key) of every subscript / ``.get`` / ``.setdefault`` / ``.pop`` with a Serve config key in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault", "pop")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if isinstance(key, str) and key in SERVE_KEYS:
            assert isinstance(node, ast.expr)  # a subscript or a call: the nodes a key is read from above
            found.append((node.lineno, key))
    return sorted(found)


def scan(root: Path) -> list[str]:
    problems = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == HOME:
                continue
            for line, key in hand_edits(path.read_text()):
                if (rel, key) not in NOT_THE_CONFIG:
                    problems.append(
                        f"{rel}:{line}: {key!r} read or written by hand (use serve_app.config.deploy_config)"
                    )
    return problems


BAD_MODULE = """
import yaml
def scale(path, n):
    cfg = yaml.safe_load(open(path))
    for app in cfg["applications"]:
        app.setdefault("deployments", []).append({"name": "LLMServer:m", "num_replicas": n})
        for llm in app.get("args", {}).get("llm_configs", []):
            llm["engine_kwargs"].pop("kv_offloading_size", None)
    return cfg
"""
GOOD_MODULE = """
from serve_app.config import deploy_config
def scale(path, n):
    cfg = deploy_config.without_engine_kwargs(deploy_config.load(path), ["kv_offloading_size"])
    args = {"applications": 1}  # a dict literal is not an edit of a loaded config
    return deploy_config.scaled(cfg, n), args["num"]
"""


def test_the_scan_catches_a_planted_hand_edit_and_passes_its_good_twin(tmp_path):
    for package in SCANNED:
        (tmp_path / package).mkdir()
    (tmp_path / "benchmarks" / "bad.py").write_text(BAD_MODULE)
    found = scan(tmp_path)
    assert {p.split(": ", 1)[1].split()[0] for p in found} == {
        "'applications'",
        "'deployments'",
        "'args'",
        "'llm_configs'",
        "'engine_kwargs'",
    }, found
    assert all(p.startswith("benchmarks/bad.py:") for p in found)
    (tmp_path / "benchmarks" / "bad.py").write_text(GOOD_MODULE)
    assert scan(tmp_path) == []
    (tmp_path / "serve_app" / "config").mkdir(parents=True, exist_ok=True)
    (tmp_path / "serve_app" / "config" / "deploy_config.py").write_text(BAD_MODULE)  # the config's home may
    assert scan(tmp_path) == []


def test_no_module_outside_the_configs_home_edits_serve_yaml_keys_by_hand():
    assert scan(REPO) == []
