"""The load generator's own accounting, against a real HTTP peer whose behaviour is known (testkit/echo_server.py).

Every request the generator starts must end as exactly one result with the
right outcome (the server counts what it received), streams cut short must
be caught, cancellations must really drop the connection, and the profiles
must start what they promise (counts, not timings).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from load_tests.load.client import send
from load_tests.load.drive import drive
from load_tests.plan.profiles import Profile
from load_tests.plan.workload import BAD_REQUESTS, FUZZ_LEVELS, MODES, Mix, RequestSpec, draw
from testkit import echo_server

if TYPE_CHECKING:
    from load_tests.operate.target import LoadTarget


def spec(i, prompt="count 1 2", stream=True, cancel=None, expect="ok", max_tokens=6, route="/v1/completions"):
    body = {"model": "fixture", "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
    return RequestSpec(i, route, body, stream=stream, cancel_after_chunks=cancel, expect=expect)


async def handlers_done(server, timeout_s: float = 60.0) -> None:
    """Until every request handler of the server has returned (a cancelled stream's handler notices the client
    left only at its next write): the server's own count, not a guess at how long that takes."""
    async with asyncio.timeout(timeout_s):
        while server.stats["in_flight"]:  # noqa: ASYNC110 -- polls another object's counter, which sets no event
            await asyncio.sleep(0.01)


async def with_server(fn, itl_ms=0.0):
    runner, server, port = await echo_server.start(itl_ms=itl_ms)
    try:
        async with aiohttp.ClientSession() as session:
            return await fn(session, f"http://127.0.0.1:{port}", server)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    "prompt, stream, cancel, expect, outcome",
    [
        ("count 1 2", True, None, "ok", "ok"),
        ("count 1 2", False, None, "ok", "ok"),
        ("count 1 2", True, 2, "ok", "cancelled"),
        ("!400", False, None, "4xx", "rejected"),
        ("!400", False, None, "ok", "unexpected_4xx"),
        ("count", False, None, "4xx", "unexpected_ok"),
        ("!500", True, None, "ok", "server_error"),
        ("!truncate", True, None, "ok", "truncated"),
        ("!drop", True, None, "ok", "truncated"),
        ("!error-event", True, None, "ok", "stream_error"),
    ],
)
def test_each_outcome_is_classified(prompt, stream, cancel, expect, outcome):
    async def go(session, base, server):
        return await send(session, base, spec(0, prompt, stream, cancel, expect), t0=0.0)

    res = asyncio.run(with_server(go))
    assert res.outcome == outcome, res
    if outcome == "ok" and stream:
        assert res.chunks == 6 and res.ttft is not None and len(res.itl) == 5
    if outcome == "cancelled":
        assert res.chunks == 2
    if outcome == "rejected":
        assert res.status == 400 and res.error_param == "vllm_xargs.fuzz_strength"


def test_a_stalled_server_becomes_a_timeout_not_a_hang():
    async def go(session, base, server):
        return await send(session, base, spec(0, "!slow", max_tokens=50), t0=0.0, timeout_s=0.5)

    res = asyncio.run(with_server(go))
    assert res.outcome == "timeout" and res.chunks < 50


def test_a_refused_connection_is_a_transport_error():
    async def go():
        async with aiohttp.ClientSession() as session:
            from load_tests.operate.ports import free_port

            return await send(session, f"http://127.0.0.1:{free_port()}", spec(0), t0=0.0)

    assert asyncio.run(go()).outcome == "transport_error"


def test_cancellation_drops_the_connection_server_side():
    async def go(session, base, server):
        results = await asyncio.gather(
            *(send(session, base, spec(i, "!slow", cancel=2, max_tokens=30), t0=0.0) for i in range(5))
        )
        await handlers_done(server)
        return results, dict(server.stats)

    results, stats = asyncio.run(with_server(go))
    assert [r.outcome for r in results] == ["cancelled"] * 5
    assert stats["disconnected"] == 5 and stats["completed"] == 0


@pytest.mark.parametrize(
    "profile",
    [
        Profile(kind="fixed", concurrency=7, max_requests=60),
        Profile(kind="ramp", concurrency=5, ramp_s=0.2, max_requests=40),
        Profile(kind="poisson", rate=400, concurrency=8, max_requests=50),
    ],
)
def test_every_started_request_ends_as_one_result(profile):
    mix = Mix(bad=0.2, cancel=0.3, stream=0.6, chat=0.3)

    async def go(session, base, server):
        results = []
        flight = {"now": 0, "max": 0}

        async def one(i):
            flight["now"] += 1
            flight["max"] = max(flight["max"], flight["now"])
            s = draw(mix, 3, i)
            if s.expect == "4xx":  # the echo server knows nothing of our rules: ask it to refuse
                s = RequestSpec(
                    i, "/v1/completions", {"model": "fixture", "prompt": "!400", "max_tokens": 2}, expect="4xx"
                )
            results.append(await send(session, base, s, t0=0.0))
            flight["now"] -= 1

        started = await drive(profile, one, seed=1)
        await handlers_done(server)
        return started, results, dict(server.stats), flight["max"]

    started, results, stats, max_flight = asyncio.run(with_server(go, itl_ms=1.0))
    assert started == profile.max_requests == len(results) == stats["received"]
    assert sorted(r.index for r in results) == list(range(started))
    assert {r.outcome for r in results} <= {"ok", "cancelled", "rejected"}
    assert sum(r.outcome == "ok" for r in results) == stats["completed"]
    # the generator's own in-flight count; the server may briefly see more, as
    # a cancelled stream's handler only notices the client left at its next write
    assert max_flight == profile.concurrency if profile.kind != "poisson" else max_flight <= profile.concurrency


def test_duration_bounded_run_stops_by_itself_and_early_stop_waits_for_in_flight():
    async def go(session, base, server):
        done = []

        async def one(i):
            done.append(await send(session, base, spec(i, max_tokens=3), t0=0.0))

        started = await drive(Profile(kind="fixed", concurrency=4, duration_s=0.3), one)
        stop = asyncio.Event()
        stop.set()
        none = await drive(Profile(kind="fixed", concurrency=4, duration_s=60), one, stop=stop)
        return started, none, done

    started, none, done = asyncio.run(with_server(go, itl_ms=1.0))
    assert started > 0 and none == 0 and len(done) == started


def test_profiles_refuse_runs_that_would_never_stop():
    with pytest.raises(ValueError, match="duration_s or max_requests"):
        Profile(kind="fixed")
    with pytest.raises(ValueError, match="rate"):
        Profile(kind="poisson", max_requests=3)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), index=st.integers(0, 10**6))
def test_draw_is_reproducible_and_well_formed(seed, index):
    mix = Mix(bad=0.2, long_prompt=0.2, cancel=0.5)
    a, b = draw(mix, seed, index), draw(mix, seed, index)
    assert a == b
    if a.expect == "4xx":
        assert a.expect_status == 400
    else:
        body = a.body
        assert body is not None
        assert body["max_tokens"] >= 1 and (("prompt" in body) != ("messages" in body))
        if a.cancel_after_chunks is not None:
            assert a.stream and 1 <= a.cancel_after_chunks < body["max_tokens"]
        words = len((body.get("prompt") or body["messages"][0]["content"]).split())
        assert words + body["max_tokens"] < 1024 - 16, "fits the fixture model's context"


def _body(s: RequestSpec) -> dict[str, Any]:
    """A drawn request's JSON body (every request but a malformed one has one)."""
    assert s.body is not None, s
    return s.body


def _bad_request_drawn(s) -> int:
    """Which entry of BAD_REQUESTS a drawn bad request is (its change applied to the base body, or its raw bytes)."""
    [i] = [
        i
        for i, (change, status, param) in enumerate(BAD_REQUESTS)
        if (
            s.raw_body == change
            if isinstance(change, bytes)
            else s.body is not None and all(s.body.get(k) == v for k, v in change.items())
        )
        and (s.expect_status, s.expect_param) == (status, param)
    ]
    return i


def test_the_mix_reaches_every_kind():
    """2000 draws of the default mix reach every kind it is made of, and nothing else: both routes, every bad
    request (each with its status and the field it names), every prompt kind and shared prefix, both fuzz modes
    at every non-zero level, unfuzzed requests with and without an explicit s = 0, streams with and without a
    cancellation, and non-streamed requests."""
    mix = Mix()
    specs = [draw(mix, 0, i) for i in range(2000)]
    assert {s.tags["kind"] for s in specs} == {"completion", "chat", "bad"}  # hostile is off by default
    assert {s.route for s in specs} == {"/v1/completions", "/v1/chat/completions"}
    bad = [s for s in specs if s.expect == "4xx"]
    assert all(s.tags["kind"] == "bad" and s.expect_status == 400 for s in bad)
    assert {_bad_request_drawn(s) for s in bad} == set(range(len(BAD_REQUESTS)))
    assert {s.tags["bad"] for s in bad} == {p if p is not None else "malformed_json" for _c, _s, p in BAD_REQUESTS}
    good = [s for s in specs if s.expect == "ok"]
    assert {s.tags["prompt"] for s in good} == {"short", "long", *(f"prefix{g}" for g in range(mix.n_prefixes))}
    assert {s.tags["fuzz_mode"] for s in good} == {"none", "scale", "gaussian"}
    for mode in MODES:
        assert {s.tags["fuzz_strength"] for s in good if s.tags["fuzz_mode"] == mode} == set(FUZZ_LEVELS[1:]), mode
    unfuzzed = [s for s in good if s.tags["fuzz_mode"] == "none"]
    assert {(_body(s).get("vllm_xargs") or {}).get("fuzz_strength") for s in unfuzzed} == {None, 0.0}
    streams = [s for s in good if s.stream]
    assert any(s.cancel_after_chunks for s in streams) and any(s.cancel_after_chunks is None for s in streams)
    assert len(streams) < len(good) and all("stream" not in _body(s) for s in good if not s.stream)


# ---------------------------------------------------------------- refusals at the ingress


async def with_ingress(refusals: int, fn, status: int = 503, reason: str | None = "router_unreachable"):
    """A server that refuses the first ``refusals`` requests as Serve's HAProxy refuses at its ingress router
    (503, ``X-Serve-Reason``, its text body), then answers: the number of requests it saw, and ``fn``'s result."""
    from aiohttp import web

    seen = []

    async def handle(request):
        seen.append(await request.json())
        if len(seen) <= refusals:
            return web.Response(
                status=status,
                text=f"Ingress request router failed: {reason}",
                headers={"X-Serve-Reason": reason} if reason else {},
            )
        return web.json_response(
            {
                "choices": [{"text": " 1", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with aiohttp.ClientSession() as session:
            server = site._server
            assert isinstance(server, asyncio.Server)
            port = server.sockets[0].getsockname()[1]
            result = await fn(session, f"http://127.0.0.1:{port}")
            return len(seen), result
    finally:
        await runner.cleanup()


def send_once(refusals, **server):
    async def go(session, base):
        return await send(session, base, spec(0, stream=False), t0=0.0, ingress_retry_delays_s=(0.01, 0.02))

    return asyncio.run(with_ingress(refusals, go, **server))


@pytest.mark.parametrize("reason", ["router_unreachable", "unknown_replica_id"])
def test_a_refusal_at_the_ingress_is_sent_again_and_kept(reason):
    seen, res = send_once(2, reason=reason)
    assert seen == 3 and res.outcome == "ok" and res.ingress_refusals == [reason, reason]


def test_a_request_refused_after_every_retry_is_a_server_error():
    seen, res = send_once(5)
    assert seen == 3, "the first try and two retries, as the openai client"
    assert res.outcome == "server_error" and res.status == 503 and res.ingress_refusals == ["router_unreachable"] * 3
    assert res.error == "Ingress request router failed: router_unreachable"


@pytest.mark.parametrize("status, reason", [(503, "router_non_200"), (503, None), (500, "router_unreachable")])
def test_other_5xx_are_never_sent_again(status, reason):
    """A router that answered but failed, a 503 from anywhere else, a 500: the request may have run, or the
    fault is not a passing gap; its outcome is the first answer."""
    seen, res = send_once(1, status=status, reason=reason)
    assert seen == 1 and res.outcome == "server_error" and res.ingress_refusals == []


def test_the_operators_own_requests_are_sent_again_after_a_refusal_at_the_ingress():
    """A redeploy's probes and the affinity check's requests count what the engines count: one refused at the
    ingress never reached an engine, so it is sent again and counted once."""
    from types import SimpleNamespace

    from load_tests.observe.monitor import InvariantChecker
    from load_tests.operate.operator import Operator
    from load_tests.plan.steps import OperationPlan, Scale

    async def go(session, base):
        target = SimpleNamespace(base_url=base, headers={}, cluster=None)
        op = Operator(
            OperationPlan(steps=(Scale(after_s=0, replicas=1),)),
            cast("LoadTarget", target),  # the fields the operator's requests read
            InvariantChecker(),
            0.0,
            asyncio.Event(),
            [],
            "fixture",
        )
        status, _ = await op.complete(session, {"model": "fixture", "prompt": "probe", "max_tokens": 1})
        return status, op.completed

    seen, (status, completed) = asyncio.run(with_ingress(1, go))
    assert seen == 2 and status == 200 and completed == 1


def test_the_mix_reaches_every_depth_scope_and_ramp_and_keeps_its_other_draws():
    """Fuzzed requests at the embeddings and at layers 1 and -1, with scopes and ramps; drawn from a stream of
    their own, so the rest of every request (its strength, mode, prompt, stream) is what the same seed drew before
    these keys existed."""
    specs = [draw(Mix(bad=0.0), 3, i) for i in range(600)]
    fuzzed = [s for s in specs if s.tags["fuzz_mode"] != "none"]
    assert {s.tags["fuzz_layer"] for s in fuzzed} == {0, 1, -1}
    assert {s.tags["fuzz_tokens"] for s in fuzzed} == {"all", "prompt", "generated"}
    assert any(s.tags["fuzz_ramp"] for s in fuzzed)
    flat = [draw(Mix(bad=0.0, deep=0.0, scheduled=0.0), 3, i) for i in range(600)]
    for a, b in zip(specs, flat, strict=True):
        assert {k: v for k, v in a.tags.items() if k not in ("fuzz_layer", "fuzz_tokens", "fuzz_ramp")} == {
            k: v for k, v in b.tags.items() if k not in ("fuzz_layer", "fuzz_tokens", "fuzz_ramp")
        }
        assert a.stream == b.stream and a.cancel_after_chunks == b.cancel_after_chunks
        xa, xb = (a.body or {}).get("vllm_xargs"), (b.body or {}).get("vllm_xargs")
        assert (xa is None) == (xb is None)
        if xb is not None and xa is not None:
            assert {k: xa[k] for k in xb} == xb
    from patches.definitions.fuzz_params import parse_fuzz_args

    for s in fuzzed:  # every drawn setting is valid for the guard's parser
        assert s.body is not None
        parse_fuzz_args(s.body["vllm_xargs"])


def test_with_the_layer_patch_off_the_run_sends_no_depth():
    from load_tests.plan.scenarios import SCENARIOS
    from load_tests.runner.run import Outputs, without_refused_depths

    sc, outputs = SCENARIOS["stress"], Outputs(out=Path("x"), title="t", fuzz_sweep_per_task=2)
    off_sc, off_out = without_refused_depths(sc, outputs, "accounting,fuzz_layer")
    assert off_sc.mix.deep == 0.0 and off_out.fuzz_sweep_layers == (0,)
    assert without_refused_depths(sc, outputs, "fuzz,fuzz_layer") == (sc, outputs)  # stock: keys ignored
    assert without_refused_depths(sc, outputs, None) == (sc, outputs)
