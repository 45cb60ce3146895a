"""The Serve configs parse as Ray Serve, as our builder's arguments and as ray.serve.llm LLMConfigs.

No cluster is started here (tests/test_serve_app.py deploys serve_config.yaml
for real); this is the schema check for both configs, including the CUDA one
that no CI machine can run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from serve_app.engine.cluster_env import FORWARD_BODY, HAPROXY
from serve_app.engine.replica_env import APPLICATION_ENV, REPLICA_ENV

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_ray_instance(monkeypatch):
    """Building a deployment reads the driver's runtime_env through ray.get_runtime_context(), which
    would start (or join) a Ray instance: these graph and schema checks need an empty one, not a cluster."""
    import types

    import ray

    monkeypatch.setattr(ray, "get_runtime_context", lambda: types.SimpleNamespace(runtime_env={}))


@pytest.fixture
def built_fixture(monkeypatch, tmp_path) -> Path:
    """A project root holding the fixture model's path (without training it): the builder resolves
    serve_config.yaml's relative model_source against it."""
    checkpoint = tmp_path / ".cache" / "models" / "fixture-llama-test"
    checkpoint.mkdir(parents=True)
    (checkpoint.parent / "fixture").symlink_to(checkpoint.name)
    monkeypatch.setattr("serve_app.app.PROJECT_ROOT", tmp_path)
    return checkpoint


def load(name: str):
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema.model_validate(yaml.safe_load((REPO / name).read_text()))


@pytest.mark.parametrize("name, kind", [("serve_config.yaml", "cpu"), ("serve_config.cuda.yaml", "gpu")])
def test_config_parses_at_every_layer(name, kind, built_fixture):
    from ray.serve.llm import LLMConfig

    from serve_app import app as app_module
    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    schema = load(name)
    [application] = schema.applications
    assert application.import_path == "serve_app.app:build_app"
    args = FuzzServeArgs.model_validate(application.args)
    for cfg in resolve_llm_configs(args, node_cpus=lambda: [4.0]):
        llm = LLMConfig.model_validate(cfg)
        assert llm.accelerator_config is not None and llm.accelerator_config.kind == kind
        assert llm.engine_kwargs["enable_prefix_caching"] is True
        assert llm.engine_kwargs["kv_offloading_backend"] == "native" and llm.engine_kwargs["kv_offloading_size"] > 0
        # cpu: sized to the cluster (a 4-core node holds 2); cuda: 2 GPU replicas
        assert (
            llm.deployment_config.get("num_replicas") or llm.deployment_config["autoscaling_config"]["min_replicas"]
        ) == 2
    # what both configs ship: the direct path, fuzz-aware routing
    assert (args.ingress, args.routing) == ("direct", "fuzz_affinity")
    assert app_module is not None


def test_shipped_cpu_config_is_the_fast_stack():
    """serve_config.yaml is the stack docs/serve.md measures as the shipped config: replicas sized to the
    cluster on the direct path, each engine (and its EngineCore) on a core of its own, the frontend's CPU
    reserved as ray.serve.llm does by default, the shm_wait nap on."""
    from serve_app.app import FuzzServeArgs

    [application] = load("serve_config.yaml").applications
    args = FuzzServeArgs.model_validate(application.args)
    assert args.server_kwargs() == {"engine_cores_per_replica": 1, "shm_wait": True}
    assert args.engine_replicas == "fit"
    assert not args.ingress_deployment_config, "the direct path has no ingress deployment to configure"
    [llm] = args.llm_configs
    assert "num_cpus" not in llm.to_dict()["deployment_config"].get("ray_actor_options", {}), (
        "the replica's frontend keeps ray.serve.llm's default reservation (1 CPU), which fit counts"
    )


@pytest.mark.parametrize(
    "node_cpus, cores, replicas",
    [
        ([2.0], 1, 1),  # this host: one replica
        ([4.0], 1, 2),
        ([3.0], 1, 1),
        ([2.0, 2.0], 1, 2),  # per node: one per 2-CPU node
        ([3.0, 3.0], 1, 2),  # leftovers of two nodes do not add up to a replica
        ([16.0], 3, 4),  # 3 engine cores + 1 frontend each
        ([1.0], 1, 1),  # never fewer than one
        ([8.0], None, 4),  # vLLM's auto binding counts as one engine core
    ],
)
def test_fit_counts_engine_and_frontend_cpus_per_node(node_cpus, cores, replicas):
    from serve_app.app import fit_replicas

    assert fit_replicas(node_cpus, cores) == replicas


def test_engine_replicas_sets_the_count_in_one_place():
    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    llm = {"model_loading_config": {"model_id": "m", "model_source": "/m"}}
    fit = FuzzServeArgs(llm_configs=[llm], engine_replicas="fit", engine_cores_per_replica=1)
    assert resolve_llm_configs(fit, node_cpus=lambda: [4.0, 2.0])[0]["deployment_config"]["num_replicas"] == 3
    three = FuzzServeArgs(llm_configs=[llm], engine_replicas=3)
    assert resolve_llm_configs(three, node_cpus=lambda: [1 / 0])[0]["deployment_config"]["num_replicas"] == 3
    for own in ({"num_replicas": 2}, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}):
        both = FuzzServeArgs(llm_configs=[{**llm, "deployment_config": own}], engine_replicas="fit")
        with pytest.raises(ValueError, match="give the replica count in one place"):
            resolve_llm_configs(both, node_cpus=lambda: [4.0])
    with pytest.raises(ValueError, match="engine_replicas"):
        FuzzServeArgs.model_validate({"llm_configs": [llm], "engine_replicas": "all"})


def test_fit_needs_a_cluster():
    import ray

    from serve_app.app import cluster_node_cpus

    assert not ray.is_initialized()
    with pytest.raises(ValueError, match="give engine_replicas a number"):
        cluster_node_cpus()


@pytest.mark.parametrize(
    "deployment_config, most",
    [
        ({}, 1),
        ({"num_replicas": 1}, 1),
        ({"num_replicas": 3}, 3),
        ({"num_replicas": "auto"}, float("inf")),
        ({"autoscaling_config": {"min_replicas": 1, "max_replicas": 5}}, 5),
        ({"autoscaling_config": {"min_replicas": 1}}, 1),
    ],
)
def test_max_replicas(deployment_config, most):
    from serve_app.app import max_replicas

    assert max_replicas(deployment_config) == most


def test_cpu_config_resolves_the_fixture_model(built_fixture):
    """serve_config.yaml names the fixture model by its path under the project root; the builder makes it
    absolute (Serve's processes run elsewhere) and builds nothing."""
    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    [application] = load("serve_config.yaml").applications
    [cfg] = resolve_llm_configs(FuzzServeArgs.model_validate(application.args), node_cpus=lambda: [2.0])
    assert cfg["model_loading_config"]["model_source"] == str(built_fixture.resolve())
    assert application.runtime_env["env_vars"] == APPLICATION_ENV, (
        "serve_config.yaml repeats serve_app.engine.engine_env's and replica_env's tables"
    )


def test_cuda_config_sets_the_replica_env():
    """serve_config.cuda.yaml sets Serve's replica settings (replica_env) as the CPU config does; the engine's
    table is the CPU engine's (a KV pool size, the fixture's hub switch) and stays out of it."""
    [application] = load("serve_config.cuda.yaml").applications
    assert application.runtime_env["env_vars"] == REPLICA_ENV


@pytest.mark.parametrize(
    "source, exists, want",
    [
        ("/abs/model", False, "/abs/model"),
        ("Qwen/Qwen2.5-1.5B-Instruct", False, "Qwen/Qwen2.5-1.5B-Instruct"),  # a model hub id
        ("models/m", True, "ROOT/models/m"),
    ],
)
def test_model_source_resolution(tmp_path, source, exists, want):
    from serve_app.app import resolve_model_source

    if exists:
        (tmp_path / source).mkdir(parents=True)
    assert resolve_model_source(source, root=tmp_path) == want.replace("ROOT", str(tmp_path.resolve()))


def test_a_missing_fixture_model_names_the_build(tmp_path):
    from serve_app.app import resolve_model_source

    with pytest.raises(ValueError, match=r"python -m fixture_model.build"):
        resolve_model_source(".cache/models/fixture", root=tmp_path)


# routing name -> the class of Serve's request router it picks
ROUTER_CLASSES = {
    "power_of_two": "PowerOfTwoChoicesRequestRouter",
    "round_robin": "RoundRobinRouter",
    "prefix_affinity": "PrefixCacheAffinityRouter",
    "fuzz_affinity": "FuzzAffinityRouter",
}


def test_routing_names_agree():
    """The builder's ``routing`` type, the routers table and the load-test CLI's ``--routing`` name the same
    routers (the Literal cannot be built from the table), and every one is tested below."""
    from typing import get_args

    from load_tests.cli import parse_args
    from serve_app.app import FuzzServeArgs
    from serve_app.routing.routers import ROUTERS, Routing

    assert set(get_args(Routing)) == set(ROUTERS) == set(ROUTER_CLASSES)
    assert FuzzServeArgs.model_fields["routing"].annotation is Routing
    for name in ROUTERS:
        assert parse_args(["--routing", name]).routing == name
    with pytest.raises(SystemExit):
        parse_args(["--routing", "random"])


@pytest.mark.parametrize("routing, cls", ROUTER_CLASSES.items())
def test_routing_choice_sets_the_request_router(routing, cls):
    from ray.serve.config import RequestRouterConfig

    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    llm = {"model_loading_config": {"model_id": "m", "model_source": "/m"}}
    for args in (
        FuzzServeArgs(llm_configs=[llm], routing=routing, engine_replicas=2),
        FuzzServeArgs(llm_configs=[llm], routing=routing, ingress="router"),
    ):
        [cfg] = resolve_llm_configs(args)
        # always explicit (the direct path's default would be round robin), and Serve can import it
        got = cfg["deployment_config"]["request_router_config"]
        assert RequestRouterConfig(**got).get_request_router_class().__name__ == cls
    # a single replica on the direct path gets none: HAProxy forwards to it (Serve refuses a custom router there)
    [cfg] = resolve_llm_configs(FuzzServeArgs(llm_configs=[llm], routing=routing, engine_replicas=1))
    assert "request_router_config" not in cfg["deployment_config"]
    # a router named by the model's own deployment_config wins
    own = {"request_router_config": {"request_router_class": "x.Y"}, "num_replicas": 2}
    args = FuzzServeArgs(
        llm_configs=[{"model_loading_config": {"model_id": "m"}, "deployment_config": own}], routing=routing
    )
    assert resolve_llm_configs(args)[0]["deployment_config"] == own


def test_builder_args_are_strict():
    from serve_app.app import FuzzServeArgs

    with pytest.raises(ValueError):
        FuzzServeArgs.model_validate({"llm_configs": [{}], "routing": "random"})
    with pytest.raises(ValueError):
        FuzzServeArgs.model_validate({"llm_configs": [{}], "gaurd": {}})
    with pytest.raises(ValueError):
        FuzzServeArgs.model_validate({"llm_configs": []})
    with pytest.raises(ValueError, match="engine_cores_per_replica"):
        FuzzServeArgs.model_validate({"llm_configs": [{}], "engine_cores_per_replica": 0})
    assert FuzzServeArgs.model_validate({"llm_configs": [{}]}).engine_cores_per_replica is None  # vLLM's auto


from ray.serve.llm import LLMServer  # noqa: E402


class _OwnServer(LLMServer):  # stands in for a user's own server class (LLMConfig.server_cls)
    pass


@pytest.mark.parametrize(
    "server_cls, cores, expected",
    [
        (None, 1, "EngineServer"),
        (None, None, "EngineServer"),
        ("tests.test_serve_config:_OwnServer", None, "_OwnServer"),
    ],
)
def test_engine_deployment_class(server_cls, cores, expected):
    """The router path uses EngineServer (deployment still named LLMServer:<model>), or the model's own server_cls."""
    from ray.serve.llm import LLMConfig

    from serve_app.app import engine_deployment

    cfg = {"model_loading_config": {"model_id": "m", "model_source": "/m"}, "accelerator_config": {"kind": "cpu"}}
    if server_cls:
        cfg["server_cls"] = server_cls
    kwargs = {"engine_cores_per_replica": cores, "shm_wait": True}
    deployment = engine_deployment(LLMConfig.model_validate(cfg), kwargs)._bound_deployment
    assert deployment.func_or_class.__name__ == expected
    if server_cls is None:
        assert deployment.name == "LLMServer:m"


def test_core_binding_with_the_models_own_server_class_is_refused():
    from ray.serve.llm import LLMConfig

    from serve_app.app import engine_deployment

    cfg = LLMConfig.model_validate(
        {
            "model_loading_config": {"model_id": "m", "model_source": "/m"},
            "accelerator_config": {"kind": "cpu"},
            "server_cls": "tests.test_serve_config:_OwnServer",
        }
    )
    with pytest.raises(ValueError, match="engine_cores_per_replica, shm_wait need the default server class"):
        engine_deployment(cfg, {"engine_cores_per_replica": 1, "shm_wait": False})
    with pytest.raises(ValueError, match=r"_OwnServer.>; shm_wait need the default server class"):
        engine_deployment(cfg, {"engine_cores_per_replica": None, "shm_wait": False})


HAPROXY_ON = {HAPROXY: "1", FORWARD_BODY: "1"}


@pytest.mark.parametrize(
    "env, body_aware, missing",
    [
        ({}, False, [f"{HAPROXY}=1"]),
        ({}, True, [f"{HAPROXY}=1", f"{FORWARD_BODY}=1"]),
        ({HAPROXY: "1"}, True, [f"{FORWARD_BODY}=1"]),
        ({HAPROXY: "true"}, False, [f"{HAPROXY}=1"]),  # Serve reads only "1"
        ({HAPROXY: "1"}, False, []),
        (HAPROXY_ON, True, []),
    ],
)
def test_direct_path_refuses_a_cluster_without_haproxy(env, body_aware, missing):
    from serve_app.app import require_haproxy

    if not missing:
        require_haproxy(body_aware, env)
        return
    with pytest.raises(ValueError) as e:
        require_haproxy(body_aware, env)
    assert all(m in str(e.value) for m in missing) and "scripts/env.sh" in str(e.value)
    assert "FORWARD_BODY" in str(e.value) or not body_aware


def test_direct_graph(monkeypatch, built_fixture):
    """ingress: direct builds FuzzServer (guard and probes inside) as the ingress deployment, named as the
    monitor knows it, with Ray's LLMRouter as its ingress request router where there are several replicas:
    what HAProxy asks for a replica."""
    from serve_app.app import build_app

    for k, v in HAPROXY_ON.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("serve_app.app.cluster_node_cpus", lambda: [2.0, 2.0])  # two 2-core nodes: 2 replicas
    [application] = load("serve_config.yaml").applications
    graph = build_app(application.args)
    server = graph._bound_deployment
    assert server._deployment_config.num_replicas == 2
    assert server.name == "LLMServer:fixture"
    assert "FuzzServer" in server.func_or_class.__name__
    assert server.init_kwargs["guard"]["xargs"]["reserved"] == "refuse"
    assert server.init_kwargs["engine_cores_per_replica"] == 1 and server.init_kwargs["shm_wait"] is True
    router = graph._ingress_request_router._bound_deployment
    from serve_app.ray_internals import LLMRouterBase

    assert router.name == "LLMRouter" and issubclass(router.func_or_class, LLMRouterBase)
    assert "FuzzIngressRouter" in router.func_or_class.__qualname__ or "FuzzIngressRouter" in str(
        router.func_or_class.__mro__
    ), "Ray's LLMRouter behind the bounded body view (serve_app/routing/ingress_router.py)"
    assert router.init_kwargs["server"] is graph, "the router picks among this deployment's replicas"
    from serve_app.engine.direct_server import ROUTER_LINGER_S

    # a stopped router keeps answering the old HAProxy processes' kept connections (issue 34), while Serve's
    # default (2 s) would not; the controller must not kill it before the linger is over
    assert router._deployment_config.graceful_shutdown_wait_loop_s == ROUTER_LINGER_S >= 15
    assert router._deployment_config.graceful_shutdown_timeout_s > 2 * ROUTER_LINGER_S
    assert server._deployment_config.request_router_config.request_router_class.endswith("FuzzAffinityRouter")
    with pytest.raises(ValueError, match="exactly one model"):
        second = {
            **application.args["llm_configs"][0],
            "model_loading_config": {"model_id": "other", "model_source": "/other"},
        }
        build_app({**application.args, "llm_configs": [*application.args["llm_configs"], second]})


def test_direct_graph_of_a_single_replica_has_no_router(monkeypatch, built_fixture):
    """On one 2-core node fit gives one replica: HAProxy forwards to it without asking a router (no
    LLMRouter, no request router class, which Serve refuses on an ingress HAProxy balances), and the
    body need not be forwarded to a router that does not exist."""
    from serve_app.app import build_app

    monkeypatch.setenv(HAPROXY, "1")
    monkeypatch.delenv(FORWARD_BODY, raising=False)
    monkeypatch.setattr("serve_app.app.cluster_node_cpus", lambda: [2.0])
    [application] = load("serve_config.yaml").applications
    graph = build_app(application.args)
    server = graph._bound_deployment
    assert "FuzzServer" in server.func_or_class.__name__ and server._deployment_config.num_replicas == 1
    assert getattr(graph, "_ingress_request_router", None) is None
    assert server._deployment_config.request_router_config.request_router_class.endswith(
        "PowerOfTwoChoicesRequestRouter"
    )


def test_router_path_graph(monkeypatch, built_fixture):
    """ingress: router keeps Serve's default path: a FuzzIngress deployment in front of EngineServer replicas."""
    from serve_app.app import build_app

    [application] = load("serve_config.yaml").applications
    graph = build_app(
        {
            **application.args,
            "ingress": "router",
            "ingress_deployment_config": {"num_replicas": 1},
            "engine_replicas": 2,
        }
    )
    ingress = graph._bound_deployment
    assert "FuzzIngress" in ingress.func_or_class.__name__ and ingress.num_replicas == 1
    engine = ingress.init_kwargs["llm_deployments"]["fixture"]._bound_deployment
    assert engine.name == "LLMServer:fixture" and engine.func_or_class.__name__ == "EngineServer"
