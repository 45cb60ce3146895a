"""The affinity check of the scale scenario (load_tests.operate.affinity): which replica each key must land on, when the
deployment counts as idle, and the verdict, fed the bad cases it must catch. The check itself runs against a real
deployment in ``python -m load_tests --scenario scale`` (docs/load_tests.md)."""

from __future__ import annotations

import asyncio
import types
from typing import TYPE_CHECKING, cast

import pytest

from load_tests.cli import parse_args, scenario_from
from load_tests.judge.evidence import check_planned_faults
from load_tests.observe.counters import ReplicaCounters
from load_tests.observe.monitor import InvariantChecker, Snapshot
from load_tests.operate.affinity import PREFIX, AffinityCheck, AffinityKey, affinity_keys, home_replica, idle_counts
from load_tests.plan.scenarios import SCENARIOS, Scenario
from load_tests.plan.steps import Scale
from load_tests.results.events import Scaled
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, replica_full_id, replica_id
from serve_app.routing.fuzz_router import DEFAULT_PREFIX_CHARS, FuzzAffinityRouter

if TYPE_CHECKING:
    from ray.serve.request_router import PendingRequest, RunningReplica

MODEL = "fixture"
LIVE = ["r1aa", "r2bb", "r3cc", "r4dd"]


def test_a_full_replica_id_is_what_serve_gives_a_request_router():
    from ray.serve._private.common import DeploymentID, ReplicaID

    rid = ReplicaID("abc123", DeploymentID(name="LLMServer:fixture", app_name="fuzzserve"))
    assert replica_full_id("abc123", "LLMServer:fixture") == rid.to_full_id_str()
    assert replica_id(rid.to_full_id_str()) == "abc123"


def route(live: list[str], xargs) -> str:
    """What the fuzz-aware router itself picks among idle replicas (no probe: affinity alone)."""
    replicas = [
        types.SimpleNamespace(
            replica_id=types.SimpleNamespace(
                to_full_id_str=lambda r=r: replica_full_id(r, ENGINE_DEPLOYMENT_PREFIX + MODEL)
            )
        )
        for r in live
    ]
    router = FuzzAffinityRouter.__new__(FuzzAffinityRouter)
    router.initialize_state(imbalanced_threshold=None)
    request = types.SimpleNamespace(args=[types.SimpleNamespace(prompt=f"{PREFIX} 7", vllm_xargs=xargs)])
    # stand-ins with the fields the router reads (a replica's full id, a request's prompt and xargs)
    [[chosen]] = asyncio.run(
        router.choose_replicas(cast("list[RunningReplica]", replicas), cast("PendingRequest", request))
    )
    return replica_id(chosen.replica_id.to_full_id_str())


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_live_replica_gets_one_key_that_the_router_sends_to_it(n):
    live = LIVE[:n]
    keys = affinity_keys(live, MODEL, DEFAULT_PREFIX_CHARS)
    assert [k.home for k in keys] == sorted(live) and [k.count for k in keys] == list(range(1, n + 1))
    assert len({str(k.xargs) for k in keys}) == n
    for k in keys:
        assert home_replica(k.xargs, live, MODEL, DEFAULT_PREFIX_CHARS) == k.home == route(live, k.xargs)
        assert len(k.body(MODEL, 0)["prompt"]) > DEFAULT_PREFIX_CHARS  # the request number is past the key


def test_keys_move_only_off_a_removed_replica():
    keys = affinity_keys(LIVE, MODEL, DEFAULT_PREFIX_CHARS)
    for k in keys[:-1]:
        assert home_replica(k.xargs, LIVE[:-1], MODEL, DEFAULT_PREFIX_CHARS) == k.home


def counters(replica, total, running=0.0, healthy=1.0):
    return ReplicaCounters(
        replica=replica, node="n", requests_finished={"length": total}, running=running, gauges=True, healthy=healthy
    )


def snap(t, errors=None, **totals):
    return Snapshot(
        float(t),
        {k: counters(k, v) if not isinstance(v, ReplicaCounters) else v for k, v in totals.items()},
        errors=errors or {},
    )


def seen(*snaps: Snapshot) -> InvariantChecker:
    """A checker that observed ``snaps`` (the monitor's scrapes during a pause)."""
    c = InvariantChecker()
    for s in snaps:
        c.observe(s)
    return c


def test_idle_means_two_idle_scrapes_a_settle_interval_apart_that_agree():
    history = [snap(0, A=5, B=5), snap(10, A=9, B=5), snap(14, A=9, B=5), snap(26, A=9, B=5)]
    assert idle_counts(seen(*history), since=0, settle_s=11) == {"A": 9, "B": 5}
    assert idle_counts(seen(*history[:3]), since=0, settle_s=11) is None, "4 s apart: an export may fall between"
    assert idle_counts(seen(*history), since=15, settle_s=11) is None, "scrapes before the pause do not count"
    busy = [*history[:3], snap(26, A=counters("A", 9, running=1.0), B=5)]
    assert idle_counts(seen(*busy), since=0, settle_s=11) is None
    failing = [*history[:3], snap(26, errors={"u": "ConnectError"}, A=9, B=5)]
    assert idle_counts(seen(*failing), since=0, settle_s=11) is None
    retired = [snap(10, A=9, B=counters("B", 3, healthy=0.0)), snap(22, A=9)]
    assert idle_counts(seen(*retired), since=0, settle_s=11) == {"A": 9}, "a retired replica is not live"


def check(after, statuses=None, before=None):
    keys = [AffinityKey(None, "A", 1), AffinityKey({"fuzz_strength": 0.5}, "B", 2)]
    return AffinityCheck(3.0, keys, before or {"A": 10.0, "B": 20.0}, after, statuses or [200, 200, 200])


def test_every_key_on_its_replica_passes():
    assert check({"A": 11.0, "B": 22.0}).problems() == []


@pytest.mark.parametrize(
    "c, problem",
    [
        (check({"A": 12.0, "B": 21.0}), "requests per replica {'A': 2.0, 'B': 1.0}"),  # homes swapped
        (check({"A": 13.0, "B": 20.0}), "requests per replica {'A': 3.0}"),  # all on one replica
        (check({"A": 11.0, "B": 22.0}, statuses=[200, 503, 200]), "1 of 3 affinity request(s) failed"),
        (check({"A": 11.0, "B": 22.0, "C": 0.0}), "the live replicas changed"),
        (check(None), "did not go idle"),
        (AffinityCheck(3.0, [], {}, why="the deployment did not go idle within 180 s"), "did not go idle"),
    ],
)
def test_an_affinity_check_fails_naming_what_broke(c, problem):
    assert any(problem in p for p in c.problems()), c.problems()


def scale_fault(affinity):
    return Scaled(
        t=2.0,
        step=Scale(after_s=0, replicas=2),
        replicas_before=["A"],
        by="serve deploy",
        converged=True,
        replicas_after=["A", "B"],
        converged_t=4.0,
        converge_s=2.0,
        affinity=affinity,
    )


def final_counters() -> InvariantChecker:
    c = InvariantChecker()
    c.observe(snap(0, A=1))
    c.observe(snap(5, A=4, B=3))
    return c


def test_the_verdict_reads_the_affinity_check():
    good = check_planned_faults(
        ("scale",), final_counters(), [scale_fault(check({"A": 11.0, "B": 22.0}).record())], True
    )[0]
    assert good.ok and "affinity: 2 fuzz setting(s) + prefix, 3 requests" in good.evidence, good
    bad = check_planned_faults(
        ("scale",), final_counters(), [scale_fault(check({"A": 12.0, "B": 21.0}).record())], True
    )[0]
    assert not bad.ok and any("routing affinity: requests per replica" in p for p in bad.problems), bad.problems


def scale_steps(sc: Scenario) -> list[Scale]:
    """The scenario's operation steps, every one of them a scale step."""
    assert sc.operations is not None
    scales = [s for s in sc.operations.steps if isinstance(s, Scale)]
    assert len(scales) == len(sc.operations.steps), sc.operations.steps
    return scales


def test_the_scale_scenario_checks_affinity_and_the_cli_can_ask_for_a_scale_that_cannot_fit():
    scale, autoscale = SCENARIOS["scale"].operations, SCENARIOS["autoscale"].operations
    assert scale is not None and autoscale is not None
    assert scale.affinity_check
    assert not autoscale.affinity_check  # pausing the load would make Serve scale down
    sc = scenario_from(parse_args(["--scenario", "scale", "--scale-to", "16", "--converge-timeout", "120"]))
    assert [(s.kind, s.replicas, s.after_s) for s in scale_steps(sc)] == [("scale", 16, 40.0)]
    sc = scenario_from(parse_args(["--scenario", "scale", "--scale-to", "3,1,2,3"]))
    assert [s.replicas for s in scale_steps(sc)] == [3, 1, 2, 3]
    with pytest.raises(ValueError, match="no scale steps"):
        scenario_from(parse_args(["--scenario", "redeploy", "--scale-to", "4"]))
    with pytest.raises(ValueError, match="no operations"):
        scenario_from(parse_args(["--scenario", "stress", "--scale-to", "4"]))
    with pytest.raises(ValueError, match="at least 1"):
        scenario_from(parse_args(["--scenario", "scale", "--scale-to", "0"]))


def test_predicting_a_home_does_not_import_ray_serve():
    """Ray Serve's import reconfigures the process's logging (the scale run's log turned to JSON lines with every
    scrape's HTTP request in it): the load generator predicts with serve_app.routing.keys alone."""
    import subprocess
    import sys

    code = (
        "import sys; from load_tests.operate.affinity import affinity_keys; "
        "affinity_keys(['a', 'b'], 'fixture', 512); "
        "assert not [m for m in sys.modules if m.startswith('ray.serve')], 'ray.serve imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
