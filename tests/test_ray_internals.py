"""serve_app.ray_internals: every private Ray symbol resolves on the pinned Ray, one that moved fails naming
itself, and the ingress request router's modules load without vLLM (its replicas start ~3x faster)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, cast

import pytest

from serve_app import ray_internals

# In a fresh interpreter, each argument's modules (comma-separated) imported in turn: after each, is vLLM loaded?
IMPORTS = """
import importlib, sys
for group in sys.argv[1:]:
    for m in group.split(","):
        importlib.import_module(m)
    print("vllm" in sys.modules)
"""


def vllm_loaded_after(*groups: str) -> list[bool]:
    r = subprocess.run([sys.executable, "-c", IMPORTS, *groups], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return [line == "True" for line in r.stdout.strip().splitlines()[-len(groups) :]]


def test_every_symbol_loaded_on_first_use_resolves():
    for name in ray_internals._ON_FIRST_USE:
        assert getattr(ray_internals, name) is not None, name


def test_a_symbol_that_moved_fails_naming_it_and_the_ray_versions(monkeypatch):
    monkeypatch.setitem(ray_internals._ON_FIRST_USE, "moved_one", ("ray.llm._internal.no_such_module", "init"))
    with pytest.raises(ray_internals.RayInternalsMoved, match=r"no_such_module\.init is gone or moved") as e:
        ray_internals.moved_one  # noqa: B018 - the attribute access is the test
    assert ray_internals.VERIFIED_RAY in str(e.value)
    with pytest.raises(AttributeError):
        ray_internals.never_declared  # noqa: B018


def test_the_ingress_routers_modules_load_without_vllm():
    """What a router replica imports (its class's module and its request router's) must not pull vLLM in; the
    engine server's module does (the control: the check sees vLLM when it is there)."""
    routers, then_engine = vllm_loaded_after(
        "serve_app.routing.ingress_router,serve_app.routing.fuzz_router", "serve_app.engine.direct_server"
    )
    assert not routers, "a router replica would import vLLM"
    assert then_engine, "the control: the engine server's module imports vLLM, and the check must see it"


def test_serve_status_is_what_the_cli_prints_from_the_dashboards_details():
    """``serve status``'s shape from the JSON of ``GET /api/serve/applications/`` (the dashboard's Serve details):
    statuses as plain strings, replicas counted by state. (Checked against the CLI on a live cluster: the results log's
    entry of 2026-11-28 21:35-00:25 UTC.)"""
    replica = {"start_time_s": 1.0}
    details = {
        "proxies": {},
        "applications": {
            "fuzzserve": {
                "name": "fuzzserve",
                "route_prefix": "/",
                "docs_path": None,
                "status": "RUNNING",
                "message": "",
                "last_deployed_time_s": 1.0,
                "source": "declarative",
                "external_scaler_enabled": False,
                "deployments": {
                    "LLMServer": {
                        "name": "LLMServer",
                        "status": "UPDATING",
                        "status_trigger": "CONFIG_UPDATE_STARTED",
                        "message": "",
                        "deployment_config": {"name": "LLMServer"},
                        "target_num_replicas": 2,
                        "required_resources": {},
                        "replicas": [
                            {**replica, "replica_id": "a", "state": "RUNNING"},
                            {**replica, "replica_id": "b", "state": "STARTING"},
                        ],
                    }
                },
            }
        },
    }
    status = ray_internals.serve_status(details)
    app = status["applications"]["fuzzserve"]
    assert type(app["status"]) is str and app["status"] == "RUNNING"
    deployment = app["deployments"]["LLMServer"]
    assert deployment["status"] == "UPDATING" and deployment["replica_states"] == {"RUNNING": 1, "STARTING": 1}
    assert status["proxies"] == {}


@pytest.mark.parametrize(
    ("usage_stats", "switch", "version", "wanted"),
    [
        ("0", None, ray_internals.VERIFIED_RAY, False),  # usage stats off: no report, no telemetry actor
        ("1", None, ray_internals.VERIFIED_RAY, True),  # on: Ray's own start, its report is sent
        ("0", "1", ray_internals.VERIFIED_RAY, True),  # the A/B switch: Ray's own start
        ("0", None, "2.61.0", True),  # an unverified Ray: its own start, whatever its steps now are
    ],
)
def test_the_usage_telemetry_report_is_skipped_only_where_nothing_sends_it(
    monkeypatch, usage_stats, switch, version, wanted
):
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", usage_stats)
    if switch is None:
        monkeypatch.delenv(ray_internals.LLM_TELEMETRY_SWITCH, raising=False)
    else:
        monkeypatch.setenv(ray_internals.LLM_TELEMETRY_SWITCH, switch)
    assert ray_internals.llm_usage_telemetry_wanted(version) is wanted


@pytest.mark.parametrize("switch", [None, "1"])
def test_the_replicas_engine_start_pushes_the_report_only_when_wanted(monkeypatch, switch):
    """EngineServer._start_engine, the real method on a bare instance: the engine always starts; Ray's telemetry
    push (which creates the actor) runs only through Ray's own start, with the switch on."""
    import asyncio

    from ray.llm._internal.serve.core.server import llm_server

    from serve_app.engine.core_binding import EngineServer

    pushed, started = [], []

    class Engine:
        async def start(self):
            started.append(True)

    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    if switch:
        monkeypatch.setenv(ray_internals.LLM_TELEMETRY_SWITCH, switch)
    monkeypatch.setattr(llm_server, "push_telemetry_report_for_all_models", lambda **kw: pushed.append(kw))
    monkeypatch.setattr(llm_server, "record_extra_usage_tag", lambda *a: None)
    server = object.__new__(EngineServer)
    server.engine, server._llm_config = cast(Any, Engine()), cast(Any, "the config")
    asyncio.run(server._start_engine())
    assert started == [True]
    assert pushed == ([{"all_models": ["the config"]}] if switch else [])


def test_a_server_class_without_the_engine_start_step_is_refused_naming_it():
    class Moved:
        pass

    ray_internals.require_start_engine(type("Kept", (), {"_start_engine": lambda self: None}))
    with pytest.raises(ray_internals.RayInternalsMoved, match=r"LLMServer\._start_engine is gone"):
        ray_internals.require_start_engine(Moved)
