"""Refusals at the ingress are excused only inside a replica change's window and within its budget
(load_tests.judge.ingress); with the retry off a refusal is a failed request."""

from __future__ import annotations

import asyncio

import pytest

from load_tests.judge.ingress import AFTER_CHANGE_S, AFTER_KILL_S, BUDGET_PER_CHANGE, ingress_problems, ingress_retries
from load_tests.load.client import RequestResult, send
from load_tests.load.outcomes import Outcome
from load_tests.plan.steps import Redeploy
from load_tests.plan.workload import RequestSpec
from load_tests.results.events import OperationFailed, Redeployed, ReplicaKilled


def refused(start: float, outcome: Outcome = "ok") -> RequestResult:
    return RequestResult(index=0, outcome=outcome, start=start, e2e=1.0, ingress_refusals=["router_unreachable"])


def redeploy(t: float = 10.0, converged_t: float | None = 50.0) -> Redeployed:
    return Redeployed(
        t=t,
        step=Redeploy(after_s=0),
        by="serve deploy",
        replicas_before=["A"],
        converged=converged_t is not None,
        converged_t=converged_t,
    )


@pytest.mark.parametrize(
    "start, excused",
    [
        (9.9, False),  # just before the change began
        (10.0, True),
        (50.0 + AFTER_CHANGE_S, True),  # the window's two ends
        (50.0 + AFTER_CHANGE_S + 0.1, False),  # just after it closed
    ],
)
def test_a_refusal_is_excused_only_inside_the_changes_window(start, excused):
    ir = ingress_retries([refused(start)], [redeploy()])
    assert (ir.in_change_windows, ir.outside_change_windows) == ((1, 0) if excused else (0, 1))
    assert bool(ingress_problems(ir)) is not excused


def test_a_kill_opens_a_window_and_a_failed_step_none():
    kill = ReplicaKilled(t=5.0, replica="r1", pid=1)
    assert not ingress_problems(ingress_retries([refused(5.0 + AFTER_KILL_S)], [kill]))
    assert ingress_problems(ingress_retries([refused(5.0 + AFTER_KILL_S + 1)], [kill]))
    failed = OperationFailed(t=5.0, step="redeploy", error="StepError: x")
    assert ingress_problems(ingress_retries([refused(6.0)], [failed])), "a step never carried out changed nothing"


def test_a_step_that_never_converged_keeps_its_window_open():
    assert not ingress_problems(ingress_retries([refused(10_000.0)], [redeploy(converged_t=None)]))


def test_the_budget_bounds_what_the_windows_excuse():
    within = [refused(20.0)] * BUDGET_PER_CHANGE
    assert not ingress_problems(ingress_retries(within, [redeploy()]))
    over = ingress_problems(ingress_retries([*within, refused(21.0)], [redeploy()]))
    assert over and "over the budget" in over[0]
    two_changes = [redeploy(), redeploy(t=200.0, converged_t=250.0)]
    assert not ingress_problems(ingress_retries([*within, refused(210.0)], two_changes)), "the budget is per change"


def test_with_the_retry_off_a_refusal_is_the_requests_outcome():
    """Against a server that refuses once as Serve's HAProxy does, then serves: with the retry the request is
    answered; without it the refusal is a 5xx the verdict counts as an error."""
    from aiohttp import web

    calls = {"n": 0}

    async def handler(request):
        calls["n"] += 1
        if calls["n"] % 2:
            return web.Response(status=503, headers={"X-Serve-Reason": "router_unreachable"})
        return web.json_response({"choices": [{"text": "x", "finish_reason": "stop"}]})

    async def scenario():
        import aiohttp

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        port = server.sockets[0].getsockname()[1]
        spec = RequestSpec(0, "/v1/completions", {"prompt": "x"})
        try:
            async with aiohttp.ClientSession() as session:
                url = f"http://127.0.0.1:{port}"
                retried = await send(session, url, spec, 0.0, ingress_retry_delays_s=(0.01,))
                plain = await send(session, url, spec, 0.0, ingress_retry_delays_s=())
        finally:
            await runner.cleanup()
        return retried, plain

    retried, plain = asyncio.run(scenario())
    assert retried.outcome == "ok" and retried.ingress_refusals == ["router_unreachable"]
    assert plain.outcome == "server_error" and plain.status == 503 and plain.ingress_refusals == ["router_unreachable"]
