"""The interleaved lever benchmark's cluster config: every arm one application, one engine replica, its own route,
its variables only in its own application's environment; the arms it cannot hold refused.

Pure config building (no cluster): the benchmark's run itself is measured by hand and logged
(docs/benchmarks.md, "Levers, interleaved").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness.arms import load_config
from benchmarks.investigations import interleaved
from patches.framework.switches import ALL, OFF_ENV

REPO = Path(__file__).resolve().parents[1]
MODEL = Path("/models/fixture")


def env_of(app) -> dict[str, str]:
    return dict((app.runtime_env or {}).get("env_vars") or {})


def test_every_arm_is_an_application_of_its_own_with_one_replica_at_its_own_route():
    config = load_config(REPO / "serve_config.yaml")
    cfg, arms = interleaved.cluster_config(["shipped", "shipped+FUZZSERVE_AA=1", "stock"], config, MODEL)
    apps = {a.name: a for a in cfg.applications}
    assert [a.app for a in arms] == ["arm0-shipped", "arm1-shipped", "arm2-stock"]
    assert [a.route_prefix for a in arms] == ["/", "/arm1", "/arm2"]
    assert [apps[a.app].route_prefix for a in arms] == ["/", "/arm1", "/arm2"]
    assert [a.ours for a in arms] == [True, True, False]
    # the shipped applications: the config's own, one engine replica each (not "fit": the cluster advertises
    # more logical CPUs than the host has, so that every arm's replica is placed)
    for name in ("arm0-shipped", "arm1-shipped"):
        assert apps[name].import_path == config.applications[0].import_path
        assert apps[name].fuzz_args.engine_replicas == 1
    # the variable reaches its own application only; the reference keeps the config's environment
    assert env_of(apps["arm1-shipped"]) == {**env_of(config.applications[0]), "FUZZSERVE_AA": "1"}
    assert env_of(apps["arm0-shipped"]) == env_of(config.applications[0])
    # the stock peer as vs_vllm builds it: ray.serve.llm's builder, every patch of ours off
    assert apps["arm2-stock"].import_path == "ray.serve.llm:build_openai_app"
    assert env_of(apps["arm2-stock"])[OFF_ENV] == ALL
    # cluster-wide settings are the config's
    assert cfg.http_options == config.http_options


def test_a_config_lever_takes_the_application_of_the_other_config(tmp_path):
    config = load_config(REPO / "serve_config.yaml")
    other = REPO / "docs" / "benchmarks" / "stream_interval" / "serve_config.stream4.yaml"
    cfg, _ = interleaved.cluster_config(["shipped", f"shipped+config={other}"], config, MODEL)
    kwargs = [a.fuzz_args.llm_configs[0].engine_kwargs for a in cfg.applications]
    assert "stream_interval" not in kwargs[0]
    assert kwargs[1]["stream_interval"] == 4


@pytest.mark.parametrize(
    ("arm", "says"),
    [
        ("plain", "only shipped, stock"),  # plain vLLM must be alone on the host: vs_vllm's
        ("engine+FUZZSERVE_AA=1", "only shipped, stock"),
        ("shipped+pin=split", "act on the whole cluster"),
        ("shipped+via=replica", "act on the whole cluster"),
    ],
)
def test_arms_that_are_not_one_application_are_refused(arm, says):
    config = load_config(REPO / "serve_config.yaml")
    with pytest.raises(ValueError, match=says):
        interleaved.cluster_config(["shipped", arm], config, MODEL)


def test_urls_join_the_route_without_a_double_slash():
    assert interleaved.url("http://h:1", "/", "/ready") == "http://h:1/ready"
    assert interleaved.url("http://h:1", "/arm1", "/ready") == "http://h:1/arm1/ready"
    assert interleaved.url("http://h:1", "/arm1", "") == "http://h:1/arm1"
