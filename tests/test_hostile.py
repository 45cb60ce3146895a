"""The hostile-client scenario (load_tests.plan.hostile, load.hostile, judge.hostile): its requests are the ones the
deployed stack refuses, its connection attackers see a close and a socket left open apart, and its judgement fails
on each thing it looks for."""

from __future__ import annotations

import asyncio

import pytest
from starlette.testclient import TestClient

from load_tests.judge.hostile import answered_as_expected, judge_hostile
from load_tests.load.client import RequestResult
from load_tests.load.hostile import HostileConnection, attack
from load_tests.plan.hostile import HEAVY_REQUESTS, HOSTILE_KINDS, HOSTILE_REQUESTS, HostilePlan
from load_tests.plan.scenarios import SCENARIOS
from load_tests.plan.slo import Slo
from load_tests.plan.workload import Mix, draw
from serve_app.ingress.edge import RefuseRayControlHeaders
from testkit.guard_app import guarded_client

PLAN = HostilePlan(windows=4, window_s=10.0, connections=1)
WINDOWS = [("calm", 0.0, 10.0), ("hostile", 10.0, 20.0), ("hostile", 20.0, 30.0), ("calm", 30.0, 40.0)]


@pytest.mark.parametrize("kind, change, headers, status, param", HOSTILE_REQUESTS, ids=HOSTILE_KINDS)
def test_each_hostile_request_is_one_the_shipped_guard_refuses_naming_it(kind, change, headers, status, param):
    """Positive control: the guard (with the shipped limits) behind Ray's header edge refuses each planned hostile
    request with the status and field the scenario expects; the same body without the change is served."""
    client = TestClient(RefuseRayControlHeaders(guarded_client().app), base_url="http://127.0.0.1:8000")
    body = {"model": "fixture", "prompt": "count 1 2", "max_tokens": 4}
    r = client.post("/v1/completions", json={**body, **change}, headers=headers)
    assert r.status_code == status and r.json()["error"]["param"] == param, r.text
    assert client.post("/v1/completions", json=body).status_code == 200


def test_hostile_requests_are_drawn_only_with_a_hostile_share_and_leave_other_draws_alone():
    calm = [draw(Mix(bad=0.0), 3, i) for i in range(300)]
    assert not any(s.tags.get("kind") == "hostile" for s in calm)
    assert calm == [draw(Mix(bad=0.0, hostile=0.0), 3, i) for i in range(300)], "the default draws are unchanged"
    hostile = [draw(Mix(bad=0.0, hostile=0.2), 3, i) for i in range(600)]
    mine = [s for s in hostile if s.tags.get("kind") == "hostile"]
    assert 80 < len(mine) < 160 and {s.tags["hostile"] for s in mine} == set(HOSTILE_KINDS)
    assert all(s.expect == "4xx" and s.expect_param for s in mine)


def result(i, outcome, start, tags, status=200, param=None, expect_param=None):
    return RequestResult(
        index=i,
        outcome=outcome,
        start=start,
        e2e=1.0,
        ttft=0.1,
        chunks=3,
        completion_tokens=3,
        status=status,
        error_param=param,
        spec={"tags": tags, "expect_status": 400 if expect_param else None, "expect_param": expect_param},
    )


def run_results(hostile_ok_per_window=10, calm_ok=10, answered=None):
    """Normal requests: ``calm_ok`` meeting the SLO in each calm window, ``hostile_ok_per_window`` in each hostile
    one; one hostile request of each kind per hostile window, answered as ``answered(kind)`` says."""
    out, i = [], 0
    for kind, start, _end in WINDOWS:
        for _ in range(calm_ok if kind == "calm" else hostile_ok_per_window):
            out.append(result(i, "ok", start + 1, {"kind": "completion"}))
            i += 1
        if kind == "hostile":
            for hk, _c, _h, status, param in HOSTILE_REQUESTS:
                answer = answered or (lambda k, status=status, param=param: ("rejected", status, param))
                outcome, code, named = answer(hk)
                out.append(result(i, outcome, start + 2, {"kind": "hostile", "hostile": hk}, code, named, param))
                i += 1
    return out


def closed(kind, after, answer=""):
    return HostileConnection(kind, 10.0, after, answer)


CONNS = [
    closed("idle", 30.1),
    closed("trickle", 30.2),
    closed("stalled_reader", 31.0),
    closed("replica_trickle", 30.1, "HTTP/1.1 408 Request Timeout"),
    closed("replica_oversized", 0.2, "HTTP/1.1 431 Request Header Fields Too Large"),
    closed("probe_withheld", 0.01, "HTTP/1.1 413 Request Entity Too Large"),
]


def test_a_run_that_holds_passes_and_its_figures_are_the_windows():
    v = judge_hostile(PLAN, run_results(), CONNS, WINDOWS, Slo())
    assert v.problems == [], v.problems
    assert v.calm_goodput_requests_per_s == 1.0 and v.hostile_goodput_requests_per_s == 1.0 and v.goodput_drop == 0
    assert all(r == {"sent": 2, "answered_as_expected": 2, "otherwise": 0} for r in v.requests.values())
    assert v.connections["stalled_reader"]["slowest_close_s"] == 31.0


@pytest.mark.parametrize(
    "results, conns, problem",
    [
        (run_results(hostile_ok_per_window=8), CONNS, "normal goodput fell 20% under attack"),
        (
            run_results(
                answered=lambda k: (
                    ("unexpected_ok", 200, None)
                    if k == "n_as_string"
                    else ("rejected", 400, {**{hk: p for hk, *_r, p in HOSTILE_REQUESTS}}[k])
                )
            ),
            CONNS,
            "hostile n_as_string: 2 of 2 not refused",
        ),
        (run_results(answered=lambda k: ("rejected", 400, "model")), CONNS, "not refused naming"),
        (
            run_results(),
            [closed("idle", 30.1), closed("trickle", None), closed("stalled_reader", 31.0)],
            "trickle connection(s) not closed by the server within 35 s",
        ),
        (
            run_results(),
            [closed("idle", 36.0), closed("trickle", 1.0), closed("stalled_reader", 31.0)],
            "idle connection(s) not closed",
        ),
        (run_results(), CONNS[:2] + CONNS[3:], "no stalled_reader connection was opened"),
        (
            run_results(),
            [*CONNS[:4], closed("replica_oversized", 0.2, ""), CONNS[5]],
            "replica_oversized connection(s) not answered 431 by the server within 5 s",
        ),
        (
            run_results(),
            [*CONNS[:5], closed("probe_withheld", 6.0, "HTTP/1.1 413 x")],
            "probe_withheld connection(s) not answered 413",
        ),
        (run_results(), CONNS[:3], "no replica_trickle connection was opened"),
        ([r for r in run_results() if r.spec["tags"]["kind"] != "hostile"], CONNS, "no hostile request was sent"),
    ],
)
def test_each_thing_the_judgement_looks_for_fails_the_run(results, conns, problem):
    v = judge_hostile(PLAN, results, conns, WINDOWS, Slo())
    assert any(problem in p for p in v.problems), v.problems


def test_a_drop_within_the_bound_passes():
    v = judge_hostile(PLAN, run_results(hostile_ok_per_window=95, calm_ok=100), CONNS, WINDOWS, Slo())
    assert v.goodput_drop == pytest.approx(0.05) and v.problems == []


def test_refused_as_expected_needs_the_status_and_the_name():
    r = result(0, "rejected", 0.0, {"kind": "hostile", "hostile": "n_as_string"}, 400, "n", "n")
    assert answered_as_expected(r)
    assert not answered_as_expected(result(0, "rejected", 0.0, {}, 422, "n", "n"))
    assert not answered_as_expected(result(0, "rejected", 0.0, {}, 400, "model", "n"))


def test_the_attackers_tell_a_server_that_closes_from_one_that_holds_the_socket():
    """Against two local servers: one closes a connection 1 s after it opens (whatever the client sends), one
    holds it open; the attacker measures the first and reports the second as still open."""

    async def scenario():
        async def closes(reader, writer):
            await asyncio.sleep(1.0)
            writer.close()

        async def holds(reader, writer):
            await asyncio.sleep(30)

        s1 = await asyncio.start_server(closes, "127.0.0.1", 0)
        s2 = await asyncio.start_server(holds, "127.0.0.1", 0)
        p1, p2 = s1.sockets[0].getsockname()[1], s2.sockets[0].getsockname()[1]
        try:
            return await asyncio.gather(
                attack("idle", f"http://127.0.0.1:{p1}", 0.0, 5.0),
                attack("trickle", f"http://127.0.0.1:{p1}", 0.0, 5.0),
                attack("stalled_reader", f"http://127.0.0.1:{p1}", 0.0, 4.0),
                attack("idle", f"http://127.0.0.1:{p2}", 0.0, 2.0),
                attack("trickle", f"http://127.0.0.1:{p2}", 0.0, 2.0),
            )
        finally:
            s1.close()
            s2.close()

    idle, trickle, stalled, held, held_trickle = asyncio.run(scenario())
    assert 0.8 < idle.closed_after_s < 2.0 and 0.8 < trickle.closed_after_s < 2.0
    assert stalled.closed_after_s is not None and stalled.closed_after_s <= 4.0, "closed while the reader stalled"
    assert held.closed_after_s is None and held_trickle.closed_after_s is None


def test_the_replica_attacks_see_a_bounded_listener_and_an_unbounded_one():
    """The three replica kinds against real uvicorn servers, one with the listener bounds (deadline shortened to
    1 s) and the guard's probe rule in front of its app, one as Ray ran them: the bounded one answers 408 / 431 /
    413 in time, the unbounded one holds the trickle and reads the oversized head whole."""
    import socket
    import threading
    import time

    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from serve_app.ingress.guard import RequestGuard
    from serve_app.ingress.listener_bounds import BoundedHttpToolsProtocol

    class Quick(BoundedHttpToolsProtocol):
        header_timeout_s = 1.0

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def serve(protocol):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(
                RequestGuard(app, {"api_keys_env": "NO_SUCH_ENV"}), http=protocol, lifespan="off", log_level="critical"
            )
        )
        threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True).start()
        while not server.started:
            time.sleep(0.02)
        return server, f"http://127.0.0.1:{sock.getsockname()[1]}"

    bounded, unbounded = serve(Quick), serve(HttpToolsProtocol)
    try:

        async def scenario():
            return await asyncio.gather(
                *(
                    attack(kind, url, 0.0, 4.0)
                    for url in (bounded[1], unbounded[1])
                    for kind in ("replica_trickle", "replica_oversized", "probe_withheld")
                )
            )

        trickle, oversized, withheld, held, read_whole, unguarded = asyncio.run(scenario())
    finally:
        bounded[0].should_exit = unbounded[0].should_exit = True
    assert (
        trickle.closed_after_s is not None
        and trickle.closed_after_s < 2.5
        and trickle.answer.startswith("HTTP/1.1 408")
    )
    assert oversized.closed_after_s < 2.0 and oversized.answer.startswith("HTTP/1.1 431")
    assert withheld.closed_after_s < 1.0 and withheld.answer.startswith("HTTP/1.1 413")
    assert held.closed_after_s is None, "uvicorn as Ray ran it holds a trickled head"
    assert not read_whole.answer.startswith("HTTP/1.1 431")
    assert unguarded.answer.startswith("HTTP/1.1 413"), "the same guard answers the probe on both"


def test_the_hostile_scenario_runs_its_windows_and_sends_nothing_bad_in_calm_ones():
    sc = SCENARIOS["hostile"]
    assert sc.hostile is not None
    assert sc.profile.duration_s == sc.hostile.duration_s and sc.hostile.windows % 4 == 0
    assert sc.mix.bad == 0 and sc.mix.hostile == 0, "calm windows send only normal requests"
    kinds = [sc.hostile.hostile_window(k) for k in range(sc.hostile.windows)]
    assert kinds.count(True) == kinds.count(False)


def test_the_drop_is_all_hostile_windows_against_all_calm_ones_and_each_block_is_shown():
    """A drift over the run (calm windows 12 then 8, hostile 10 and 10 between them: a linear slide) is no drop:
    the ABBA order cancels it; the block's own drop is reported beside."""
    results, i = [], 0
    for (_kind, start, _end), n in zip(WINDOWS, (12, 10, 10, 8), strict=False):
        for _ in range(n):
            results.append(result(i, "ok", start + 1, {"kind": "completion"}))
            i += 1
    v = judge_hostile(PLAN.model_copy(update={"share": 0.0, "connections": 0}), results, [], WINDOWS, Slo())
    assert v.goodput_drop == pytest.approx(0.0) and v.block_drops == [pytest.approx(0.0)] and v.problems == []


def test_the_aa_control_sends_nothing_hostile_and_asks_for_nothing_hostile():
    aa = SCENARIOS["hostile-aa"]
    assert aa.hostile is not None
    assert aa.hostile.share == 0 and aa.hostile.connections == 0
    assert aa.hostile.model_copy(update={"share": 0.2, "connections": 4}) == SCENARIOS["hostile"].hostile
    assert aa.profile == SCENARIOS["hostile"].profile and aa.mix == SCENARIOS["hostile"].mix
    v = judge_hostile(aa.hostile, [r for r in run_results() if r.spec["tags"]["kind"] != "hostile"], [], WINDOWS, Slo())
    assert v.problems == [], v.problems


def test_the_windows_must_be_the_load():
    """A hostile plan runs in whole ABBA blocks over a fixed load of exactly its windows: an early end (a shorter
    --duration, a request count) would add empty windows to both sides of the comparison."""
    from pydantic import ValidationError

    from load_tests.cli import parse_args, scenario_from

    with pytest.raises(ValidationError, match="multiple of 4"):
        HostilePlan(windows=6)
    for flags in (["--duration", "60"], ["--requests", "500"], ["--profile", "poisson", "--rate", "5"]):
        with pytest.raises(ValueError, match="need a fixed load of exactly 240 s"):
            scenario_from(parse_args(["--scenario", "hostile", *flags]))
    assert scenario_from(parse_args(["--scenario", "hostile", "--concurrency", "32"])).profile.concurrency == 32


@pytest.mark.parametrize("kind, change, headers, status, param", HEAVY_REQUESTS, ids=[k for k, *_ in HEAVY_REQUESTS])
def test_the_positive_controls_requests_are_legal_and_the_most_the_shipped_guard_admits(
    kind, change, headers, status, param
):
    """The heavy set is what a client with a key may send: the guard (shipped limits) serves it, and one more
    sequence (n + 1) is refused, so it sits exactly at the cap."""
    client = TestClient(RefuseRayControlHeaders(guarded_client().app), base_url="http://127.0.0.1:8000")
    body = {"model": "fixture", "prompt": "count 1 2", "max_tokens": 4, **change}
    assert status == 200 and param is None
    assert client.post("/v1/completions", json=body, headers=headers).status_code == 200
    over = client.post("/v1/completions", json={**body, "n": body["n"] + 1}, headers=headers)
    assert over.status_code == 400, over.text


def test_the_heavy_control_draws_only_legal_requests_that_expect_to_be_served_and_is_judged_so():
    sc = SCENARIOS["hostile-heavy"]
    assert sc.hostile is not None
    assert sc.hostile.requests == "heavy" and sc.hostile.connections == 0 and sc.hostile.share > 0
    assert sc.profile == SCENARIOS["hostile"].profile and sc.mix == SCENARIOS["hostile"].mix
    mix = sc.mix.model_copy(update={"hostile": 1.0, "hostile_requests": "heavy"})
    specs = [draw(mix, 7, i) for i in range(20)]
    assert {s.tags["hostile"] for s in specs} == {"heavy_legal_batch"}
    assert all(s.expect == "ok" and s.expect_status == 200 and s.body is not None and s.body["n"] == 8 for s in specs)
    served = result(0, "ok", 11.0, {"kind": "hostile", "hostile": "heavy_legal_batch"}, 200, None, None)
    refused = result(1, "rejected", 12.0, {"kind": "hostile", "hostile": "heavy_legal_batch"}, 400, "n", None)
    for r in (served, refused):
        r.spec.update(expect_status=200, expect_param=None)
    assert answered_as_expected(served) and not answered_as_expected(refused)
    v = judge_hostile(sc.hostile, [served, refused], [], WINDOWS, Slo())
    assert v.requests == {"heavy_legal_batch": {"sent": 2, "answered_as_expected": 1, "otherwise": 1}}
    assert any("heavy_legal_batch: 1 of 2 not answered 200" in p for p in v.problems), v.problems
