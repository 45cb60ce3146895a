"""The Serve configs parse as Ray Serve, as our builder's arguments and as ray.serve.llm LLMConfigs.

No cluster is started here (tests/test_serve_app.py deploys serve_config.yaml
for real); this is the schema check for both configs, including the CUDA one
that no CI machine can run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    from ray.serve.schema import ServeDeploySchema

    return ServeDeploySchema.model_validate(yaml.safe_load((REPO / name).read_text()))


@pytest.mark.parametrize("name, kind", [("serve_config.yaml", "cpu"), ("serve_config.cuda.yaml", "gpu")])
def test_config_parses_at_every_layer(name, kind, monkeypatch):
    from ray.serve.llm import LLMConfig

    from serve_app import app as app_module
    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    schema = load(name)
    [application] = schema.applications
    assert application.import_path == "serve_app.app:build_app"
    args = FuzzServeArgs.model_validate(application.args)
    # resolve without training the fixture model: only the path matters here
    monkeypatch.setattr("fixture_model.build.ensure_model", lambda: Path("/nonexistent/fixture"))
    for cfg in resolve_llm_configs(args):
        llm = LLMConfig.model_validate(cfg)
        assert llm.accelerator_config.kind == kind
        assert llm.engine_kwargs["enable_prefix_caching"] is True
        assert llm.engine_kwargs["kv_offloading_backend"] == "native" and llm.engine_kwargs["kv_offloading_size"] > 0
        assert llm.deployment_config["autoscaling_config"]["min_replicas"] == 2
    assert app_module is not None


def test_cpu_config_resolves_the_fixture_model(monkeypatch):
    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    monkeypatch.setattr("fixture_model.build.ensure_model", lambda: Path("/built/fixture"))
    [application] = load("serve_config.yaml").applications
    [cfg] = resolve_llm_configs(FuzzServeArgs.model_validate(application.args))
    assert cfg["model_loading_config"]["model_source"] == "/built/fixture"
    assert application.runtime_env["env_vars"]["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("routing, cls", [
    ("power_of_two", None),
    ("prefix_affinity", "ray.serve.llm.request_router.PrefixCacheAffinityRouter"),
    ("fuzz_affinity", "serve_app.routing.FuzzAffinityRouter"),
])
def test_routing_choice_sets_the_request_router(routing, cls):
    from ray.serve.config import RequestRouterConfig

    from serve_app.app import FuzzServeArgs, resolve_llm_configs

    args = FuzzServeArgs(llm_configs=[{"model_loading_config": {"model_id": "m", "model_source": "/m"}}], routing=routing)
    [cfg] = resolve_llm_configs(args)
    got = cfg["deployment_config"].get("request_router_config")
    assert (got or {}).get("request_router_class") == cls
    if cls:  # Serve can import it
        RequestRouterConfig(**got).get_request_router_class()
    # a router named by the model's own deployment_config wins
    own = {"request_router_config": {"request_router_class": "x.Y"}}
    args = FuzzServeArgs(llm_configs=[{"model_loading_config": {"model_id": "m"}, "deployment_config": own}],
                         routing=routing)
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


def test_fuzz_affinity_key():
    from serve_app.routing import affinity_key

    assert affinity_key("abc", None) == "abc"
    assert affinity_key("abc", {"fuzz_strength": 0}) == "abc", "s = 0 shares KV with unfuzzed requests"
    a = affinity_key("abc", {"fuzz_strength": 0.5})
    assert a.endswith("abc") and a != "abc"
    assert affinity_key("abc", {"fuzz_strength": 1.0}) == affinity_key("abc", {"fuzz_strength": 7.0}), \
        "scale s >= 1 all zero the embeddings: one salt"
    assert affinity_key("abc", {"fuzz_strength": 1, "fuzz_mode": "gaussian", "fuzz_seed": 1}) != \
        affinity_key("abc", {"fuzz_strength": 1, "fuzz_mode": "gaussian", "fuzz_seed": 2})
    assert affinity_key("abc", {"fuzz_strength": -1}) == "abc", "invalid settings never reach routing; no crash"


from ray.llm._internal.serve.core.server.llm_server import LLMServer  # noqa: E402


class _OwnServer(LLMServer):  # stands in for a user's own server class (LLMConfig.server_cls)
    pass


@pytest.mark.parametrize("server_cls, cores, expected", [
    (None, 1, "EngineServer"),
    (None, None, "EngineServer"),
    ("tests.test_serve_config:_OwnServer", None, "_OwnServer"),
])
def test_engine_deployment_class(server_cls, cores, expected):
    """The router path uses EngineServer (deployment still named LLMServer:<model>), or the model's own server_cls."""
    from ray.serve.llm import LLMConfig

    from serve_app.app import engine_deployment

    cfg = {"model_loading_config": {"model_id": "m", "model_source": "/m"}, "accelerator_config": {"kind": "cpu"}}
    if server_cls:
        cfg["server_cls"] = server_cls
    deployment = engine_deployment(LLMConfig.model_validate(cfg), cores)._bound_deployment
    assert deployment.func_or_class.__name__ == expected
    if server_cls is None:
        assert deployment.name == "LLMServer:m"


def test_core_binding_with_the_models_own_server_class_is_refused():
    from ray.serve.llm import LLMConfig

    from serve_app.app import engine_deployment

    cfg = LLMConfig.model_validate({"model_loading_config": {"model_id": "m", "model_source": "/m"},
                                    "accelerator_config": {"kind": "cpu"},
                                    "server_cls": "tests.test_serve_config:_OwnServer"})
    with pytest.raises(ValueError, match="engine_cores_per_replica needs the default server class"):
        engine_deployment(cfg, 1)
