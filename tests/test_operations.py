"""The operations under load (load_tests.operate.operator), their pure parts fed each bad case and its good twin.

What a redeploy and a scale send to Serve, how the monitor treats a node the
run killed, how a retired replica is told from a dead one, what the verdict
requires of each operation, and the recorder that feeds the alert replay.
The operations themselves run end to end in ``tests/test_operations_serve.py``
(redeploy-lite, a long test) and by hand (docs/load_tests.md, Operations).
"""

from __future__ import annotations

import copy
import itertools

import pytest

from load_tests.cli import parse_args, scenario_from
from load_tests.judge.departures import planned_departures, unexpected_deaths
from load_tests.judge.evidence import check_planned_faults
from load_tests.observe.counters import ReplicaCounters
from load_tests.observe.monitor import SCRAPE_FAILURE_BOUND, InvariantChecker, Snapshot
from load_tests.observe.record import kept
from load_tests.operate.logs import forced_kills
from load_tests.operate.steps import step_of
from load_tests.plan.scenarios import SCENARIOS
from load_tests.plan.steps import Autoscale, NodeLoss, OperationPlan, Redeploy, Scale
from load_tests.results.events import GuardProbe, NodeLost, OperationFailed, Redeployed, Scaled
from monitoring.families import referenced_families
from monitoring.files import RULES_FILE
from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig, to_document
from testkit.monitoring.record import input_series


def rc(replica, node="n", prompt=100.0, local=60.0, hit=30.0, ext=10.0, cached=40.0, healthy=None, **fields):
    return ReplicaCounters(
        replica=replica,
        node=node,
        prompt_tokens=prompt,
        prompt_tokens_cached=cached,
        by_source={"local_compute": local, "local_cache_hit": hit, "external_kv_transfer": ext},
        requests_finished={"length": 4.0},
        gauges=True,
        healthy=healthy,
        **fields,
    )


def shipped() -> ServeConfig:
    return deploy_config.load()


def redeployed_config(cfg: ServeConfig, step: Redeploy) -> ServeConfig:
    """What the redeploy step sends (load_tests.operate.steps.RedeployStep)."""
    return deploy_config.redeployed(cfg, step.engine_kwargs, step.allow_xargs)


# ---------------------------------------------------------------- what is sent to Serve


def test_a_redeploy_changes_the_engine_and_allows_the_probe_key_and_nothing_else():
    cfg = shipped()
    new = to_document(
        redeployed_config(
            cfg, Redeploy(after_s=0, engine_kwargs={"kv_offloading_size": 0.2}, allow_xargs=("fuzzserve_probe",))
        )
    )
    assert to_document(cfg) == to_document(shipped()), "the config redeployed from is not changed"
    old_doc = to_document(cfg)
    args, old = new["applications"][0]["args"], old_doc["applications"][0]["args"]
    assert args["llm_configs"][0]["engine_kwargs"] == {
        **old["llm_configs"][0]["engine_kwargs"],
        "kv_offloading_size": 0.2,
    }
    assert args["guard"]["xargs"]["allowed_extra_keys"] == ["fuzzserve_probe"]
    rest = copy.deepcopy(new)
    rest["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["kv_offloading_size"] = old["llm_configs"][0][
        "engine_kwargs"
    ]["kv_offloading_size"]
    rest["applications"][0]["args"]["guard"]["xargs"]["allowed_extra_keys"] = []
    assert rest == old_doc
    again = redeployed_config(deploy_config.parse(new), Redeploy(after_s=0, allow_xargs=("fuzzserve_probe",)))
    assert again.applications[0].fuzz_args.guard.xargs.allowed_extra_keys == ("fuzzserve_probe",)


def test_a_scale_overrides_num_replicas_in_the_deployments_section_not_the_args():
    """Serve hashes the app's args into its code version: the same count under args would restart every replica."""
    cfg = shipped()
    new = deploy_config.scaled(cfg, 4)
    assert new.applications[0].args == cfg.applications[0].args
    assert to_document(new)["applications"][0]["deployments"] == [{"name": "LLMServer:fixture", "num_replicas": 4}]
    assert to_document(deploy_config.scaled(new, 1))["applications"][0]["deployments"] == [
        {"name": "LLMServer:fixture", "num_replicas": 1}
    ]


def deployed_args(sc) -> dict:
    """The app's args as the load tests deploy them for ``sc`` (load_tests.operate.deploy, default settings)."""
    from load_tests.operate.deploy import DeploySettings, scenario_config

    return to_document(scenario_config(shipped(), sc, DeploySettings()))["applications"][0]["args"]


@pytest.mark.parametrize("name", ["redeploy", "redeploy-lite"])
def test_a_redeploy_scenario_forces_new_replicas_and_allows_a_key_the_shipped_guard_refuses(name):
    """What makes the redeploy observable: an engine setting that differs from the deployed one (a change under
    the app's args: Serve replaces every replica) and a vllm_xargs key that the deployed guard refuses and the
    redeployed one accepts (what the probes see change)."""
    from serve_app.ingress.guard import GuardConfig
    from serve_app.ingress.xargs_policy import RequestRejected, check_xargs

    sc = SCENARIOS[name]
    assert sc.operations is not None
    [step] = sc.operations.steps
    assert isinstance(step, Redeploy) and sc.planned_faults == ("redeploy",)
    before = deploy_config.parse(
        {"applications": [{"name": "fuzzserve", "import_path": deploy_config.BUILDER, "args": deployed_args(sc)}]}
    )
    after = to_document(redeployed_config(before, step))
    old_args, new_args = to_document(before)["applications"][0]["args"], after["applications"][0]["args"]
    old_kw, new_kw = old_args["llm_configs"][0]["engine_kwargs"], new_args["llm_configs"][0]["engine_kwargs"]
    assert step.engine_kwargs and all(old_kw.get(k) != v for k, v in step.engine_kwargs.items()), (old_kw, step)
    assert new_kw != old_kw and new_args != old_args
    key = sc.operations.probe_key
    assert key is not None and key in step.allow_xargs
    with pytest.raises(RequestRejected) as refused:
        check_xargs({key: 1}, GuardConfig.model_validate(old_args["guard"]).xargs)
    assert refused.value.param == f"vllm_xargs.{key}"
    assert check_xargs({key: 1}, GuardConfig.model_validate(new_args["guard"]).xargs)[0] == {key: 1}


def test_redeploy_lite_is_the_same_redeploy_under_less_load():
    """CI's redeploy carries out the full scenario's operation (only sooner), under a lighter load; the full one
    runs under the main job's load."""
    full, lite = SCENARIOS["redeploy"], SCENARIOS["redeploy-lite"]
    assert full.operations is not None and lite.operations is not None
    [f], [li] = full.operations.steps, lite.operations.steps
    assert li.model_copy(update={"after_s": f.after_s}) == f and li.after_s <= f.after_s
    assert lite.profile.concurrency < full.profile.concurrency == SCENARIOS["stress"].profile.concurrency


def test_the_scale_plan_goes_up_then_down_and_back_checking_affinity_after_each_step():
    sc = SCENARIOS["scale"]
    assert sc.operations is not None
    steps = sc.operations.steps
    assert all(isinstance(s, Scale) for s in steps) and sc.planned_faults == ("scale",)
    scales = [s for s in steps if isinstance(s, Scale)]  # every step (asserted above), typed as one
    counts = [deployed_args(sc)["engine_replicas"], *(s.replicas for s in scales)]
    assert all(a != b for a, b in itertools.pairwise(counts)), f"a step that changes nothing: {counts}"
    up = next(i for i in range(1, len(counts)) if counts[i] > counts[i - 1])
    assert up == 1 and any(counts[i] < counts[i - 1] for i in range(up + 1, len(counts))), counts
    assert min(counts) >= 1 and counts[-1] == counts[0], "ends as deployed"
    assert sc.operations.affinity_check and all(step_of(s).checks_affinity for s in steps)


# a replacement on a fresh node under the full load took 303, 435 and 488 s on this host (docs/results_log.md)
MEASURED_NODE_REPLACEMENT_S = (303, 435, 488)


def test_the_node_loss_scenario_kills_a_node_that_holds_a_replica_and_leaves_room_to_replace_it():
    """Nodes sized for one replica each (fit_replicas, as serve_app sizes them): the nodes other than the killed
    one cannot hold every replica, so it holds one; its survivors plus the spare workers can, and without the
    spares they could not; the step waits longer than a replacement was measured to take."""
    from serve_app.app import fit_replicas

    sc = SCENARIOS["node-loss"]
    assert sc.operations is not None
    [step] = sc.operations.steps
    assert isinstance(step, NodeLoss) and sc.planned_faults == ("node_loss",)
    shape, args = sc.cluster, deployed_args(sc)
    assert shape is not None
    replicas, cores = args["engine_replicas"], args["engine_cores_per_replica"]
    assert step.node in [f"worker{i + 1}" for i in range(shape.workers)], "a worker there at deploy, not a spare"
    others: list[float] = [shape.head_cpus, *[shape.worker_cpus] * (shape.workers - 1)]
    assert fit_replicas([*others, shape.worker_cpus], cores) == replicas, "the deploy places every replica"
    assert fit_replicas(others, cores) < replicas, "the killed node holds a replica"
    assert fit_replicas([*others, *[shape.worker_cpus] * shape.spare_workers], cores) >= replicas
    assert sc.operations.converge_timeout_s > max(MEASURED_NODE_REPLACEMENT_S)


@pytest.mark.parametrize("name", [n for n, sc in SCENARIOS.items() if sc.operations is not None])
def test_every_steps_converge_timeout_fits_the_scenarios_cap(name):
    """The load stops at the profile's duration (the operations' cap) or when the plan ends: the plan must end
    first even if every step takes its whole converge timeout (and every affinity check its whole idle waits), or
    the last steps would run without load."""
    sc = SCENARIOS[name]
    plan = sc.operations
    assert plan is not None
    assert sc.profile.max_requests is None and sc.profile.duration_s is not None, "only the cap stops the load early"
    # a scale step with the affinity check also pauses the load until the deployment is idle, twice (before and after
    # its requests), each wait bounded by affinity_idle_timeout_s
    pauses = sum(2 * plan.affinity_idle_timeout_s for s in plan.steps if plan.affinity_check and s.kind == "scale")
    worst = sum(s.after_s + plan.converge_timeout_s for s in plan.steps) + pauses + plan.tail_s
    assert worst <= sc.profile.duration_s, (worst, sc.profile.duration_s)


def test_the_cli_refuses_operation_flags_where_they_cannot_apply():
    with pytest.raises(ValueError, match="no operations"):
        scenario_from(parse_args(["--scenario", "stress", "--redeploy-engine-kwargs", "{}"]))
    with pytest.raises(ValueError, match="run it once"):
        scenario_from(parse_args(["--scenario", "scale", "--repeat", "2"]))
    sc = scenario_from(
        parse_args(
            [
                "--scenario",
                "redeploy",
                "--redeploy-engine-kwargs",
                '{"max_model_len": 99999}',
                "--converge-timeout",
                "60",
            ]
        )
    )
    assert sc.operations is not None
    step = sc.operations.steps[0]
    assert isinstance(step, Redeploy)
    assert step.engine_kwargs == {"max_model_len": 99999}
    assert sc.operations.converge_timeout_s == 60


def test_a_plan_names_its_probe_key():
    assert OperationPlan(steps=(Scale(after_s=1, replicas=2),)).probe_key is None
    assert OperationPlan(steps=(Scale(after_s=1, replicas=2), Redeploy(after_s=1, allow_xargs=("k",)))).probe_key == "k"
    with pytest.raises(ValueError):
        OperationPlan(steps=())


# ---------------------------------------------------------------- the monitor and a lost node


def two_nodes(t, a=None, b=None, errors=None):
    reps = {}
    if a is not None:
        reps["A"] = rc("A", node="u1", prompt=a, local=a, hit=0, ext=0, cached=0)
    if b is not None:
        reps["B"] = rc("B", node="u2", prompt=b, local=b, hit=0, ext=0, cached=0)
    return Snapshot(float(t), reps, errors=errors or {})


def lost_node_history(declare: bool) -> InvariantChecker:
    c = InvariantChecker()
    c.observe(two_nodes(0, 10, 10))
    c.observe(two_nodes(1, 20, 20))
    if declare:
        assert c.lose_endpoint("u2", 1.5) == ["B"]
    for t in range(2, 2 + SCRAPE_FAILURE_BOUND + 2):
        c.observe(two_nodes(t, 20 + t, None, errors={"u2": "ConnectError"}))
    c.check_quiescent(two_nodes(10, 30, None, errors={"u2": "ConnectError"}))
    return c


def test_a_declared_lost_node_is_not_a_scrape_failure_and_its_replicas_are_dead_from_the_loss():
    c = lost_node_history(declare=True)
    assert c.ok, c.violations
    assert c.deaths == {"B": 1.5} and "B" in c.stale and "A" not in c.stale
    assert all(e["planned"] for e in c.scrape_errors)
    assert c.live() == {"A"}


def test_an_undeclared_lost_node_fails_the_run_naming_its_endpoint():
    c = lost_node_history(declare=False)
    assert [v.kind for v in c.violations] == ["scrape_failed"]
    assert c.violations[0].counter == "u2"


def test_errors_of_a_lost_endpoint_before_the_loss_still_count():
    c = InvariantChecker()
    c.observe(two_nodes(0, 10, 10))
    for t in (1, 2):
        c.observe(two_nodes(t, 10, None, errors={"u2": "ConnectError"}))
    c.lose_endpoint("u2", 5.0)
    assert [v.kind for v in c.violations] == ["scrape_failed"]


# ---------------------------------------------------------------- retired or dead


def leaving(failures: float) -> InvariantChecker:
    """Replica A serves, then Serve marks it unhealthy (health 0) at t = 3 with ``failures`` failed health checks."""
    c = InvariantChecker()
    c.observe(Snapshot(0.0, {"A": rc("A", healthy=1.0)}))  # N, the replacement, comes up during the run
    for t in (1, 2):
        c.observe(Snapshot(float(t), {"A": rc("A", healthy=1.0), "N": rc("N", healthy=1.0)}))
    for t in range(3, 6):
        c.observe(
            Snapshot(float(t), {"A": rc("A", healthy=0.0, health_check_failures=failures), "N": rc("N", healthy=1.0)})
        )
    return c


@pytest.mark.parametrize("failures, planned", [(0.0, True), (1.0, False)])
def test_a_replica_stopped_after_a_redeploy_is_retired_unless_it_failed_health_checks(failures, planned):
    c = leaving(failures)
    assert c.deaths == {"A": 3.0}
    redeploy = [Redeployed(t=2.0, step=Redeploy(after_s=0), by="serve deploy", replicas_before=[])]
    assert ("A" in planned_departures(c, redeploy)) is planned
    assert unexpected_deaths(c, redeploy) == ([] if planned else ["A"])


def test_without_an_operation_a_clean_stop_is_still_a_death():
    assert unexpected_deaths(leaving(0.0), []) == ["A"]


def test_a_death_before_the_operation_began_is_not_a_retirement():
    assert unexpected_deaths(
        leaving(0.0), [Scaled(t=4.0, step=Scale(after_s=0, replicas=1), by="serve deploy", replicas_before=[])]
    ) == ["A"]


def test_replicas_lost_with_the_node_are_planned_and_ray_listing_counts_too():
    c = leaving(1.0)
    loss = [
        NodeLost(
            t=2.0,
            step=NodeLoss(after_s=0),
            by="SIGKILL",
            replicas_before=["A"],
            node="worker1",
            pids=[],
            endpoint="http://worker1",
            replicas=["A"],
        )
    ]
    assert unexpected_deaths(c, loss) == []
    assert unexpected_deaths(c, loss, listed_dead=["X"]) == ["X"], "a replica Ray lost without an operation"


# ---------------------------------------------------------------- the verdict's evidence


def converged_redeploy(probes, converged=True):
    event = Redeployed(
        t=2.0,
        step=Redeploy(after_s=0, allow_xargs=("k",)),
        replicas_before=["A"],
        by="serve deploy",
        probes=[
            GuardProbe(t=t, status=status, names_key=named, answered=answered) for t, status, named, answered in probes
        ],
        converged=converged,
    )
    if converged:
        event.replicas_after, event.converged_t, event.converge_s = ["N"], 4.0, 2.0
    else:
        event.why = "0 replica(s) serving after 480 s, want 1 new ones"
    return event


# [sent, status, names the key, answered]; the redeploy began at t = 2 and converged at t = 4
GOOD_PROBES = [
    [0.5, 400, True, 0.6],
    [1.5, 400, True, 1.6],
    [3.0, 200, False, 3.1],
    [4.5, 200, False, 4.6],
    [5.0, 200, False, 5.1],
]


def evidence(fault, forced=(), failures=0.0):
    c = leaving(failures)
    return check_planned_faults(("redeploy",), c, [fault], True, list(forced))[0]


def test_a_clean_redeploy_has_its_evidence():
    check = evidence(converged_redeploy(GOOD_PROBES))
    assert check.ok, check.problems
    assert "2/2 refused naming it before, 2/2 accepted after" in check.evidence  # 3.0: during the rollout
    # sent before the redeploy began and answered after it: in flight across it, either answer is right
    assert evidence(converged_redeploy([*GOOD_PROBES, [1.9, 200, False, 2.1], [3.9, 400, True, 4.1]])).ok


@pytest.mark.parametrize(
    "fault, forced, failures, problem",
    [
        (converged_redeploy(GOOD_PROBES, converged=False), (), 0.0, "did not converge: 0 replica(s) serving"),
        (converged_redeploy([[0.5, 200, False, 0.6], *GOOD_PROBES[1:]]), (), 0.0, "1 probe(s) not refused naming it"),
        (converged_redeploy([*GOOD_PROBES[:-1], [5.0, 400, True, 5.1]]), (), 0.0, "1 probe(s) not accepted"),
        (converged_redeploy([*GOOD_PROBES, [6.0, 503, False, 6.1]]), (), 0.0, "neither 200 nor 400"),
        (converged_redeploy(GOOD_PROBES[2:]), (), 0.0, "0 before the redeploy"),
        (
            converged_redeploy(GOOD_PROBES),
            ["... did not shut down after grace period, force-killing it"],
            0.0,
            "force-killed 1 draining replica",
        ),
        (converged_redeploy(GOOD_PROBES), (), 2.0, "died with failed health checks"),
    ],
)
def test_a_redeploy_that_misbehaves_fails_naming_what(fault, forced, failures, problem):
    check = evidence(fault, forced, failures)
    assert not check.ok and any(problem in p for p in check.problems), check.problems


def test_an_operation_the_run_never_carried_out_did_not_fire():
    check = check_planned_faults(("scale",), InvariantChecker(), [], True)[0]
    assert not check.fired and "no scale" in check.evidence


def test_a_node_loss_that_took_no_replica_proves_nothing():
    fault = NodeLost(
        t=1.0,
        step=NodeLoss(after_s=0),
        by="SIGKILL",
        node="worker1",
        pids=[],
        endpoint="http://w1",
        replicas=[],
        replicas_before=["A"],
        replicas_after=["A"],
        converged=True,
        converged_t=1.0,
        converge_s=0.0,
    )
    check = check_planned_faults(("node_loss",), leaving(0.0), [fault], True)[0]
    assert any("held no replica" in p for p in check.problems)


def test_forced_kills_are_read_from_the_controller_log(tmp_path):
    logs = tmp_path / "logs" / "serve"
    logs.mkdir(parents=True)
    (logs / "controller_1.log").write_text(
        "INFO ok\nWARNING Replica(id='x') did not shut down after grace period, force-killing it.\n"
    )
    assert len(forced_kills(tmp_path)) == 1
    assert forced_kills(None) == []


# ---------------------------------------------------------------- the recording the alert replay reads


def test_the_recorder_keeps_every_family_the_rules_name_and_no_histogram():
    for family in referenced_families(RULES_FILE):
        assert kept(f'{family}{{a="b"}} 1'), family
    assert kept('ray_vllm_generation_tokens_total{ReplicaId="r"} 3')
    assert not kept('ray_vllm_e2e_request_latency_seconds_bucket{le="1.0"} 3')
    assert not kept('ray_serve_deployment_processing_latency_ms_count{deployment="d"} 3')
    assert not kept("# TYPE ray_vllm_e2e_request_latency_seconds histogram")
    assert not kept("ray_node_cpu_utilization{} 3")


def test_a_recording_becomes_promtool_series_that_end_when_their_target_goes():
    text = 'ray_vllm_prompt_tokens_total{ReplicaId="r1",empty=""} {v}\n'
    records = [
        {"t": 0.0, "url": "http://127.0.0.1:1/metrics", "text": text.replace("{v}", "1")},
        {"t": 0.2, "url": "http://127.0.0.1:2/metrics", "text": text.replace("r1", "r2").replace("{v}", "5")},
        {"t": 10.1, "url": "http://127.0.0.1:1/metrics", "text": text.replace("{v}", "2")},
        {"t": 10.0, "url": "http://127.0.0.1:2/metrics", "error": "ConnectError"},
        {"t": 30.0, "url": "http://127.0.0.1:1/metrics", "text": text.replace("{v}", "2")},
        {"t": 30.0, "url": "http://127.0.0.1:2/metrics", "error": "ConnectError"},
    ]
    series, steps = input_series(records, step_s=10, after_s=60)
    assert steps == 4
    r1 = 'ray_vllm_prompt_tokens_total{ReplicaId="r1",instance="127.0.0.1:1",job="ray"}'
    r2 = 'ray_vllm_prompt_tokens_total{ReplicaId="r2",instance="127.0.0.1:2",job="ray"}'
    assert series == {r1: "1 2 _ 2 2x6", r2: "5 stale _x2"}


# ---------------------------------------------------------------- the load an autoscaling run changes


def test_the_load_follows_its_level_up_and_down():
    """drive_levels keeps the level's requests in flight: more when it rises; when it falls, the surplus finish
    the request they have (none is cut) and no more start. Each request waits until the test answers it, so
    every count is exact, whatever the host's speed."""
    import asyncio

    from load_tests.load.drive import LoadLevel, drive_levels

    async def scenario():
        level, stop = LoadLevel(2), asyncio.Event()
        waiting: list[asyncio.Future] = []  # one per request in flight, until answer() resolves it
        calls: list[int] = []
        peak = 0
        started_one = asyncio.Condition()

        async def one(i):
            nonlocal peak
            answered = asyncio.get_running_loop().create_future()
            calls.append(i)
            waiting.append(answered)
            peak = max(peak, len(waiting))
            async with started_one:
                started_one.notify_all()
            await answered

        def answer() -> None:
            for f in waiting:
                f.set_result(None)
            waiting.clear()

        async def in_flight(n: int) -> int:
            """Once n requests are in flight and everything runnable has run: how many are."""
            async with asyncio.timeout(10):
                async with started_one:
                    await started_one.wait_for(lambda: len(waiting) >= n)
            for _ in range(50):  # let every task that could start a request run (no sleep: ready callbacks only)
                await asyncio.sleep(0)
            return len(waiting)

        task = asyncio.create_task(drive_levels(level, one, stop))
        seen = [await in_flight(2)]
        answer()  # both answered: two take their place, and no more
        seen.append(await in_flight(2))
        peaks = [peak]
        level.set(8)
        seen.append(await in_flight(8))
        peaks.append(peak)
        level.set(1)
        seen.append(await in_flight(8))  # the 8 in flight are not cut
        peak = 0
        answer()  # the 7 surplus end; one request follows
        seen.append(await in_flight(1))
        answer()
        seen.append(await in_flight(1))
        peaks.append(peak)
        level.set(3)  # up again: the ended workers' places are taken anew
        seen.append(await in_flight(3))
        peaks.append(peak)
        stop.set()
        seen.append(await in_flight(3))  # stop cuts nothing either...
        waits_for_them = not task.done()  # ...and the load waits for the requests in flight
        answer()
        started = await asyncio.wait_for(task, 10)  # a load that went on after stop fails here, not hangs
        return seen, peaks, waits_for_them, calls, started, len(waiting), [c for _t, c in level.history]

    seen, peaks, waits_for_them, calls, started, left, history = asyncio.run(scenario())
    assert seen == [2, 2, 8, 8, 1, 1, 3, 3] and peaks == [2, 8, 1, 3]
    assert started == len(calls) == 2 + 2 + 6 + 1 + 1 + 2 and calls == list(range(started)), "each index once, in order"
    assert waits_for_them and left == 0 and history == [8, 1, 3]


def test_the_autoscale_scenario_leaves_sizing_to_serve():
    """Each step's load asks Serve's autoscaler for the replicas the step waits for (the default policy: the
    requests in flight over target_ongoing_requests, rounded up, within min..max), starting from its initial
    count, up and then back down to the minimum; the config is one Serve accepts."""
    import math

    from pydantic import ValidationError
    from ray.serve.config import AutoscalingConfig

    sc = SCENARIOS["autoscale"]
    assert sc.operations is not None and sc.autoscaling is not None
    auto, steps = sc.autoscaling, sc.operations.steps
    assert sc.operations.changes_load and all(isinstance(s, Autoscale) for s in steps)
    AutoscalingConfig.model_validate(auto)
    with pytest.raises(ValidationError):  # the check above can fail
        AutoscalingConfig.model_validate({**auto, "min_replicas": auto["max_replicas"] + 1})

    def aimed_at(in_flight: int) -> int:
        wanted = math.ceil(in_flight / auto["target_ongoing_requests"])
        return min(auto["max_replicas"], max(auto["min_replicas"], wanted))

    assert aimed_at(sc.profile.concurrency) == auto["initial_replicas"]
    autoscales = [s for s in steps if isinstance(s, Autoscale)]  # every step (asserted above), typed as one
    for s in autoscales:
        assert auto["min_replicas"] <= s.replicas <= auto["max_replicas"] and aimed_at(s.concurrency) == s.replicas, s
    counts = [auto["initial_replicas"], *(s.replicas for s in autoscales)]
    assert counts[1] > counts[0] and counts[-1] == auto["min_replicas"] < max(counts), counts


def test_a_step_that_could_not_be_carried_out_is_named():
    failed = OperationFailed(t=3.0, step="scale", error="ClusterError: serve deploy failed (1): bad config")
    check = check_planned_faults(("scale",), InvariantChecker(), [failed], True)[0]
    assert not check.fired and "serve deploy failed (1): bad config" in check.evidence


def test_the_autoscale_scenario_hands_serve_an_autoscaling_config_and_no_fixed_count():
    """What `--scenario autoscale` deploys (the config document; building it needs a Ray cluster: Serve's builder
    starts one for an autoscaled deployment)."""
    from load_tests.operate.deploy import DeploySettings, scenario_config

    args = to_document(scenario_config(shipped(), SCENARIOS["autoscale"], DeploySettings()))["applications"][0]["args"]
    assert args["engine_replicas"] is None
    assert args["llm_configs"][0]["deployment_config"]["autoscaling_config"] == SCENARIOS["autoscale"].autoscaling
    fixed = to_document(scenario_config(shipped(), SCENARIOS["redeploy"], DeploySettings()))["applications"][0]["args"]
    assert fixed["engine_replicas"] == 2 and "autoscaling_config" not in fixed["llm_configs"][0]["deployment_config"]


def test_a_step_that_failed_after_an_earlier_one_converged_still_fails_the_run():
    """The plan stops at a step that could not be carried out; an earlier step of the same kind converging must
    not hide it (the old check looked at failures only when no step of the kind ran at all)."""
    done = Scaled(
        t=2.0,
        step=Scale(after_s=0, replicas=1),
        by="serve deploy",
        replicas_before=["A"],
        converged=True,
        converged_t=3.0,
        converge_s=1.0,
        replicas_after=["A"],
    )
    failed = OperationFailed(t=9.0, step="scale", error="ClusterError: serve deploy failed (1): bad config")
    assert check_planned_faults(("scale",), InvariantChecker(), [done], True)[0].ok, "the control: it passes alone"
    check = check_planned_faults(("scale",), InvariantChecker(), [done, failed], True)[0]
    assert not check.ok and any("could not be carried out" in p and "bad config" in p for p in check.problems)
