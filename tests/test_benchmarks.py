"""The benchmark commands run end to end on tiny sizes and write their result files.

No timing is asserted (benchmarks measure, tests check): that every target
answered every request, that the ratio table is complete, and that each ratio
in it is the one its runs give (the same round's run of the reference divided
into the run; the pure tests below feed hand-made runs whose ratios are known).
"""

from __future__ import annotations

import copy
import json
from typing import cast

import pytest

from patches.framework.switches import OFF_ENV
from patches.shm_wait import NAP_ENV
from serve_app.engine.cluster_env import HAPROXY


@pytest.mark.long  # a benchmark's own run: docs/development.md, the long tests
@pytest.mark.engine
@pytest.mark.serve  # starts Ray clusters (the Serve targets)
def test_serve_stack_benchmark_tiny(tmp_path, fixture_model):
    from benchmarks import serve_stack

    # The smallest phase (one application in its cluster: fb1) and the offline ceiling: every code path of the
    # benchmark (the vLLM server a, a Ray phase, the ceiling, the ratios, the table) at a third of the cost of a
    # four-application phase (CI's time budget); the phases with more targets differ only in their table rows.
    assert (
        serve_stack.main(
            [
                "--phases",
                "alone,ceiling",
                "--rounds",
                "1",
                "--requests",
                "6",
                "--concurrency",
                "3",
                "--output-tokens",
                "4",
                "--variants",
                "plain,prefix",
                "--warmup-requests",
                "3",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "serve_stack.json").read_text())
    assert data["meta"]["failed_phases"] == {}
    runs = data["runs"]
    assert all(r["warmup_requests"] == 3 for r in runs if r["phase"] == "alone")
    assert {(r["target"], r["variant"]) for r in runs} == {
        (t, v) for t in ("a", "fb1", "ceil") for v in ("plain", "prefix")
    }
    assert all(r["requests"] == 6 and r["req_per_s"] == pytest.approx(6 / r["wall_s"]) for r in runs)
    rows = {(r["target"], r["variant"]): r for r in data["ratios"]}
    run = {(r["phase"], r["target"], r["variant"]): r for r in runs}  # one round: one run each
    # each ratio is its run over the same phase's (one round's) run of a; the ceiling (no a of its own) over a's
    # one run of that variant
    for variant in ("plain", "prefix"):
        assert rows[("fb1", variant)]["req_per_s_x_a"] == pytest.approx(
            run[("alone", "fb1", variant)]["req_per_s"] / run[("alone", "a", variant)]["req_per_s"]
        )
    assert rows[("ceil", "plain")]["req_per_s_x_a"] == pytest.approx(
        run[("ceiling", "ceil", "plain")]["req_per_s"] / run[("alone", "a", "plain")]["req_per_s"]
    )
    assert rows[("fb1", "prefix")]["ttft_p50_x_a"] == pytest.approx(
        run[("alone", "fb1", "prefix")]["ttft_p50"] / run[("alone", "a", "prefix")]["ttft_p50"]
    )
    assert rows[("ceil", "plain")]["ttft_p50_x_a"] is None, "the offline ceiling streams nothing: no TTFT"
    md = (tmp_path / "serve_stack.md").read_text()
    assert "python -m benchmarks.serve_stack --phases alone,ceiling" in md and "| fb1 |" in md


@pytest.mark.long  # a benchmark's own run: docs/development.md, the long tests
@pytest.mark.engine
def test_patch_overhead_benchmark_tiny(tmp_path, fixture_model):
    from benchmarks import patch_overhead

    assert (
        patch_overhead.main(["--rounds", "1", "--requests", "4", "--output-tokens", "4", "--out", str(tmp_path)]) == 0
    )
    data = json.loads((tmp_path / "patch_overhead.json").read_text())
    seen = {(r["workload"], r["engine"]) for r in data["runs"]}
    assert seen == {(w, e) for w in ("decode", "prefill") for e in ("off", "on", "on+offload", "on-worker")} | {
        (f"{w}+{f}", e) for w in ("decode", "prefill") for f in ("fuzz", "noise") for e in ("on", "on+offload")
    }
    assert all(r["req_per_s"] == pytest.approx(4 / r["wall_s"]) for r in data["runs"])
    rows = {(r["workload"], r["engine"]): r for r in data["table"]}
    run = {(r["workload"], r["engine"]): r for r in data["runs"]}  # one round: one run each
    # x off: the run over the same round's stock run of its unfuzzed workload; x unfuzzed: over the same
    # engine's unfuzzed run
    assert rows[("decode", "on")]["x_off"] == pytest.approx(
        run[("decode", "on")]["req_per_s"] / run[("decode", "off")]["req_per_s"]
    )
    assert rows[("prefill+fuzz", "on+offload")]["x_off"] == pytest.approx(
        run[("prefill+fuzz", "on+offload")]["req_per_s"] / run[("prefill", "off")]["req_per_s"]
    )
    assert rows[("decode+fuzz", "on")]["x_unfuzzed"] == pytest.approx(
        run[("decode+fuzz", "on")]["req_per_s"] / run[("decode", "on")]["req_per_s"]
    )
    # the noise-only control must keep the unfuzzed text, or it would not isolate the machinery's cost
    assert rows[("decode+noise", "on")]["same_text_as_unfuzzed"] >= 0.75
    # CPU is counted in 10 ms clock ticks, so a run this small may measure 0 ms: no value is known in advance,
    # but the split is exact (frontend + engine = the whole) and the table keeps the one run's figure
    for r in data["runs"]:
        assert r["frontend_cpu_ms_per_req"] + r["engine_cpu_ms_per_req"] == pytest.approx(r["cpu_ms_per_req"])
    assert rows[("decode+noise", "on")]["engine_cpu_ms_per_req"] == run[("decode+noise", "on")]["engine_cpu_ms_per_req"]
    md = (tmp_path / "patch_overhead.md").read_text()
    assert "| prefill+fuzz | on+offload |" in md and "| decode+noise | on |" in md


def test_patch_overhead_summary_survives_runs_with_no_measured_cpu():
    """A run can measure 0 ms of CPU (clock ticks): its ratios are None, the others still computed (CI hit this)."""
    from benchmarks import patch_overhead as po

    def run(rnd, w, e, req_per_s, cpu, engine_cpu):
        return {
            "round": rnd,
            "workload": w,
            "engine": e,
            "req_per_s": req_per_s,
            "tok_per_s": 4 * req_per_s,
            "cpu_ms_per_req": cpu,
            "frontend_cpu_ms_per_req": cpu - engine_cpu,
            "engine_cpu_ms_per_req": engine_cpu,
            "distinct_tokens_per_req": 3.0,
            **({"same_text_as_unfuzzed": 1.0} if "+" in w else {}),
        }

    runs = [
        run(0, "decode", "off", 10.0, 0.0, 0.0),
        run(0, "decode", "on", 12.0, 5.0, 0.0),
        run(0, "decode+noise", "on", 6.0, 10.0, 2.5),
        run(1, "decode", "off", 10.0, 4.0, 2.0),
        run(1, "decode", "on", 8.0, 2.0, 1.0),
        run(1, "decode+noise", "on", 4.0, 4.0, 2.0),
    ]
    rows = {(r["workload"], r["engine"]): r for r in po.summarize(runs)}
    on = rows[("decode", "on")]
    assert (on["x_off"], on["x_off_min"], on["x_off_max"]) == (1.0, 0.8, 1.2)
    assert on["cpu_x_off"] == on["cpu_x_off_min"] == 0.5  # round 0 has no stock CPU to divide by
    noise = rows[("decode+noise", "on")]
    assert noise["x_unfuzzed"] == pytest.approx(0.5) and noise["engine_cpu_x_unfuzzed"] == 2.0  # round 1 only
    assert po.ratio_stats([(1.0, 0.0)]) == (None, None, None)
    md = po.markdown(
        {
            "command": "x",
            "machine": "m",
            "date": "d",
            "workload": {"requests": 1, "prompt_tokens": 1, "output_tokens": 1, "rounds": 2, "omp_bind": "0"},
        },
        po.summarize(runs[:3]),
    )
    assert "| decode | on | 12.0 | 1.200 |" in md and "| - |" in md


def test_serve_stack_ratios_divide_by_the_same_rounds_a_and_the_ceiling_by_every_a():
    """Hand-made runs whose ratios are known: each run over its own phase-round-variant's ``a``, the median over
    rounds; the ceiling (a phase with no ``a``) over the median of every ``a`` run of its variant; a key a run does
    not have, or a reference of 0, gives no ratio rather than a guess."""
    from benchmarks.serve_stack import ratios

    def run(phase, rnd, variant, target, req_per_s, ttft_p50=None):
        return {
            "phase": phase,
            "round": rnd,
            "variant": variant,
            "target": target,
            "req_per_s": req_per_s,
            "ttft_p50": ttft_p50,
        }

    runs = [
        run("offstack", 0, "plain", "a", 10.0, 0.10),
        run("offstack", 0, "plain", "b", 8.0, 0.30),
        run("offstack", 1, "plain", "a", 20.0, 0.20),
        run("offstack", 1, "plain", "b", 10.0, 0.10),
        run("offstack", 2, "plain", "a", 40.0, 0.0),
        run("offstack", 2, "plain", "b", 36.0, 0.50),
        run("offstack", 0, "prefix", "a", 4.0),
        run("offstack", 0, "prefix", "b", 6.0),
        run("ceiling", 0, "plain", "ceil", 40.0),
        run("ceiling", 0, "prefix", "ceil", 2.0),
    ]
    rows = {(r["target"], r["variant"]): r for r in ratios(runs)}
    b = rows[("b", "plain")]
    assert b["runs"] == 3 and b["req_per_s"] == 10.0  # median of 8, 10, 36
    assert b["req_per_s_x_a"] == pytest.approx(0.8)  # median of 8/10, 10/20, 36/40 = 0.8, 0.5, 0.9
    assert b["ttft_p50_x_a"] == pytest.approx(1.75)  # median of 3.0 and 0.5; round 2's a measured 0: no ratio
    assert rows[("b", "prefix")]["req_per_s_x_a"] == pytest.approx(1.5)  # against prefix's a (4), not plain's
    assert rows[("ceil", "plain")]["req_per_s_x_a"] == pytest.approx(2.0)  # 40 / median(10, 20, 40)
    assert rows[("ceil", "prefix")]["req_per_s_x_a"] == pytest.approx(0.5)  # 2 / 4
    assert rows[("ceil", "plain")]["ttft_p50_x_a"] is None and rows[("b", "plain")]["tpot_p50_x_a"] is None


def test_serve_stack_phases_deploy_valid_configs_with_each_lever_only_where_named(tmp_path):
    """Every phase's config passes Serve's own schema, routes every target, and each lever sits on its target only.

    The lever phases compare deployments that differ in one setting; a lever
    that leaked into the control, or never reached its target, would make the
    comparison measure nothing. Pure config (no cluster).
    """
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    from benchmarks.harness import targets as ss

    cfg, _, _ = ss.phase_config("levers", tmp_path)  # the schema check below can fail: two targets on one route
    clash = copy.deepcopy(cfg)
    clash["applications"][1]["route_prefix"] = clash["applications"][0]["route_prefix"]
    with pytest.raises(ValidationError, match="duplicate applications for route prefix"):
        ServeDeploySchema.model_validate(clash)
    for phase, targets in ss.PHASES.items():
        cfg, routes, env = ss.phase_config(phase, tmp_path)
        ServeDeploySchema.model_validate(cfg)
        assert set(targets) <= set(routes) and all(t in ss.LABELS for t in targets)
        assert (env[HAPROXY] == "1") == (
            phase
            in (
                "direct",
                "levers",
                "alone",
                "alonespin",
                "alonenap",
                "shipped",
                "shippedeager",
                "shippedspin",
                "shippedworker",
                "shippedopt",
                "shippedbalance",
                "shippedthread",
                "shippedaccess",
                "stockdirect2",
            )
        ), phase
        for a in cfg["applications"]:  # no router-path target slipped onto the (now default) direct path
            assert ss.is_direct(a) == (
                a["name"]
                in (
                    "bd",
                    "f0",
                    "f",
                    "fb",
                    "fbs",
                    "fbr",
                    "fbt",
                    "fbq",
                    "fbn",
                    "fbc",
                    "fb1",
                    "fb1s",
                    "fb1n",
                    "S",
                    "Se",
                    "Ss",
                    "Sw",
                    "So",
                    "Sb",
                    "St",
                    "Sa",
                    "bd2",
                )
            ), a["name"]
    cfg, _, _ = ss.phase_config("levers", tmp_path)
    apps = {a["name"]: a for a in cfg["applications"]}
    env_of = {n: a["runtime_env"]["env_vars"] for n, a in apps.items()}
    assert [n for n, e in env_of.items() if e.get("RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD") == "0"] == [
        "fbt",
        "fbq",
    ]
    assert [n for n, a in apps.items() if a.get("logging_config", {}).get("enable_access_log") is False] == ["fbq"]
    assert [n for n, e in env_of.items() if NAP_ENV in e] == ["fbn"]
    assert env_of["fbn"][NAP_ENV] == "5e-05"
    # fbc binds through the builder (engine_cores_per_replica), every other target through vLLM's variable
    assert [n for n, a in apps.items() if "engine_cores_per_replica" in a["args"]] == ["fbc"]
    assert apps["fbc"]["args"]["engine_cores_per_replica"] == 1 and "VLLM_CPU_OMP_THREADS_BIND" not in env_of["fbc"]
    assert all(e["VLLM_CPU_OMP_THREADS_BIND"] == "0" for n, e in env_of.items() if n != "fbc")
    assert all(OFF_ENV not in e for e in env_of.values())
    assert all(a["args"]["ingress"] == "direct" for a in apps.values())
    [alone] = ss.phase_config("alone", tmp_path)[0]["applications"]
    assert alone["runtime_env"] == apps["fbc"]["runtime_env"] and alone["args"] == apps["fbc"]["args"]
    # the alone A/Bs differ from fb1 in exactly the one setting they name
    [spin] = ss.phase_config("alonespin", tmp_path)[0]["applications"]
    [nap] = ss.phase_config("alonenap", tmp_path)[0]["applications"]
    assert spin["args"] == nap["args"] == alone["args"]
    assert spin["runtime_env"]["env_vars"] == {**alone["runtime_env"]["env_vars"], OFF_ENV: "shm_wait"}
    assert nap["runtime_env"]["env_vars"] == {**alone["runtime_env"]["env_vars"], NAP_ENV: "5e-05"}
    bound = {a["name"]: a for a in ss.phase_config("bound", tmp_path)[0]["applications"]}
    [two] = ss.phase_config("two", tmp_path)[0]["applications"]
    [twospin] = ss.phase_config("twospin", tmp_path)[0]["applications"]
    assert two["args"] == twospin["args"] == bound["eb"]["args"] and two["runtime_env"] == bound["eb"]["runtime_env"]
    assert twospin["runtime_env"]["env_vars"] == {**two["runtime_env"]["env_vars"], OFF_ENV: "shm_wait"}


def test_shipped_targets_are_serve_config_yaml_with_one_change_each(tmp_path):
    """S is serve_config.yaml itself (what users deploy) with its replica count fixed (``engine_replicas: fit``
    sizes it to the benchmark's cluster, not to the host); each S variant changes the one setting it names, and
    the stock targets it is compared with differ from each other only in the path."""
    import yaml

    from benchmarks.harness import targets as ss

    [shipped] = yaml.safe_load(ss.SHIPPED_CONFIG.read_text())["applications"]
    assert shipped["args"]["engine_replicas"] == "fit"
    shipped["args"]["engine_replicas"] = ss.STACK_REPLICAS

    def only(phase):
        [a] = ss.phase_config(phase, tmp_path)[0]["applications"]
        return a

    s = only("shipped")
    assert {k: v for k, v in s.items() if k not in ("name", "route_prefix")} == {
        k: v for k, v in shipped.items() if k not in ("name", "route_prefix")
    }
    eager = only("shippedeager")
    assert s["args"]["llm_configs"][0]["engine_kwargs"]["enforce_eager"] is False, "compiled ships"
    assert eager["args"]["llm_configs"][0]["engine_kwargs"] == {
        **s["args"]["llm_configs"][0]["engine_kwargs"],
        "enforce_eager": True,
    }
    assert {**eager["args"], "llm_configs": None} == {**s["args"], "llm_configs": None}
    assert only("shippedspin")["args"] == {**s["args"], "shm_wait": False}
    assert only("shippedopt")["runtime_env"]["env_vars"] == {
        **s["runtime_env"]["env_vars"],
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    }
    balance = only("shippedbalance")
    assert balance["runtime_env"] == s["runtime_env"] and {**balance["args"], "llm_configs": None} == {
        **s["args"],
        "llm_configs": None,
    }
    assert balance["args"]["llm_configs"][0]["deployment_config"] == {
        **s["args"]["llm_configs"][0]["deployment_config"],
        "request_router_config": {
            "request_router_class": "serve_app.routing.fuzz_router.FuzzAffinityRouter",
            "request_router_kwargs": {"imbalanced_threshold": 4},
        },
    }
    worker = only("shippedworker")
    assert worker["args"] == s["args"] and worker["runtime_env"]["env_vars"] == {
        **s["runtime_env"]["env_vars"],
        OFF_ENV: "cpu_inproc",
    }
    assert only("shippedrouter")["args"] == {**s["args"], "ingress": "router"}
    thread, access = only("shippedthread"), only("shippedaccess")
    assert thread["args"] == access["args"] == s["args"]
    assert thread["logging_config"] == s["logging_config"] == {"enable_access_log": False}, "serve_config.yaml's"
    assert s["runtime_env"]["env_vars"]["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"  # serve_config.yaml's
    assert thread["runtime_env"]["env_vars"] == {
        **s["runtime_env"]["env_vars"],
        "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "1",
    }
    assert access["runtime_env"] == s["runtime_env"] and access["logging_config"] == {"enable_access_log": True}
    b2, bd2 = only("stock2"), only("stockdirect2")
    assert b2["args"] == bd2["args"] and b2["args"]["llm_configs"][0]["deployment_config"]["autoscaling_config"] == {
        "min_replicas": 2,
        "max_replicas": 2,
    }
    assert bd2["runtime_env"]["env_vars"] == {
        **b2["runtime_env"]["env_vars"],
        "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1",
    }


def test_routing_hits_targets_are_the_shipped_app_with_their_named_router(tmp_path):
    """routing_hits deploys serve_config.yaml's app per target, changing only replicas, KV pool and router
    (and, for Rb, the router's balance threshold); every config is one Serve accepts. Pure config."""
    from ray.serve.schema import ServeDeploySchema

    from benchmarks import routing_hits as rh
    from benchmarks.harness.targets import shipped_app
    from serve_app.routing.routers import ROUTERS, Routing

    names = tuple(rh.TARGETS)
    apps = {a["name"]: a for a in rh.target_apps(48, names)}
    assert set(apps) == set(names) and set(rh.DEFAULT_TARGETS) < set(names)
    ServeDeploySchema.model_validate({"applications": list(apps.values())})
    base = shipped_app("x")
    for name, a in apps.items():
        _label, args, replicas = rh.TARGETS[name]
        assert a["runtime_env"] == base["runtime_env"]
        assert {**a["args"], "llm_configs": None} == {
            **base["args"],
            **args,
            "engine_replicas": replicas,
            "llm_configs": None,
        }, name
        [llm] = a["args"]["llm_configs"]
        assert llm["engine_kwargs"] == {
            **base["args"]["llm_configs"][0]["engine_kwargs"],
            "num_gpu_blocks_override": 48,
        }
        assert "autoscaling_config" not in llm["deployment_config"], "one place for the count: engine_replicas"
        router = llm["deployment_config"].get("request_router_config")
        if name in rh.ROUTER_KWARGS:
            routing = cast("Routing", args["routing"])  # a builder argument: one of the routings ROUTERS names
            assert router == {**ROUTERS[routing], "request_router_kwargs": rh.ROUTER_KWARGS[name]}
        else:
            assert router is None, name  # the builder sets it from `routing`


def test_layer_cost_runs_its_arms_abba_and_divides_within_pairs():
    """benchmarks.layer_cost: each pair and mode runs both arms, the first arm alternating; each figure is the
    median of within-pair ratios; the goal is met only when the whole interval clears it."""
    from benchmarks import layer_cost as lc

    order = lc.plan(4)
    firsts = [next(arm for p, m, arm, w in order if (p, m, w) == (pair, "eager", "neutral")) for pair in range(4)]
    assert firsts == ["without", "with", "without", "with"]
    assert {(m, a, w) for _p, m, a, w in order} == {(m, a, "neutral") for m in lc.MODES for a in lc.ARMS} | {
        (m, "with", w) for m in lc.MODES for w in lc.FUZZED
    }

    def run(p, m, a, w, rps, cpu):
        return {"pair": p, "mode": m, "arm": a, "workload": w, "req_per_s": rps, "cpu_ms_per_req": cpu}

    runs = []
    for p in range(4):
        for m in lc.MODES:
            runs += [run(p, m, "without", "neutral", 10.0, 4.0), run(p, m, "with", "neutral", 10.0 - 0.1 * p, 4.0)]
            runs += [run(p, m, "with", w, 5.0, 8.0 if p else 0.0) for w in lc.FUZZED]
    table = lc.summarize(runs)
    neutral = next(
        r for r in table if (r["mode"], r["compare"], r["figure"]) == ("eager", "neutral: with / without", "req_per_s")
    )
    assert neutral["ratios"] == pytest.approx([1.0, 0.99, 0.98, 0.97]) and neutral["median"] == pytest.approx(0.985)
    assert lc.verdict(neutral) == "not met"  # the interval reaches 0.97
    assert lc.verdict({"ci90": [0.981, 1.02]}) == "met" and lc.verdict({"ci90": [None, None]}) == "not met"
    noise = next(
        r
        for r in table
        if (r["mode"], r["compare"], r["figure"]) == ("compiled", "noise@-1 / neutral", "cpu_ms_per_req")
    )
    assert noise["median"] == pytest.approx(2.0)
    md = lc.markdown(
        {
            "command": "c",
            "machine": "m",
            "date": "d",
            "model": "fixture",
            "workload": {
                "requests": 1,
                "prompt_tokens": 1,
                "output_tokens": 1,
                "pairs": 4,
                "omp_bind": "0",
                "host_cores": "1",
            },
        },
        runs,
        table,
    )
    assert "| eager | neutral: with / without | 0.985 [" in md and "not met" in md


@pytest.mark.long  # a benchmark's own run: docs/development.md, the long tests
@pytest.mark.engine
def test_layer_cost_benchmark_tiny(tmp_path, fixture_model):
    from benchmarks import layer_cost

    args = ["--pairs", "2", "--requests", "4", "--output-tokens", "4", "--settle-s", "0", "--out", str(tmp_path)]
    assert layer_cost.main(args) == 0
    data = json.loads((tmp_path / "layer_cost.json").read_text())
    assert len(data["runs"]) == len(layer_cost.plan(2))
    assert (tmp_path / "layer_cost.md").read_text().startswith("# What fuzz at depth costs")
