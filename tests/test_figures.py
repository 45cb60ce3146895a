"""Every request has the figures it can have, and goodput judges every successful request.

The load tests' figures, as vLLM's ``bench serve`` defines them: TTFT is the
first chunk that carries a token, even one whose text is empty (a fuzzed
greedy answer's often is); chat's announcement of the speaker is not a
token. A non-streamed request is judged on its end-to-end time
(:meth:`load_tests.plan.slo.Slo.met`). Against ``testkit/echo_server.py``
with deterministic latencies, and on hand-made results for the rule itself.
"""

from __future__ import annotations

import asyncio

import aiohttp
from hypothesis import given
from hypothesis import strategies as st

from load_tests.judge.figures import latency, throughput
from load_tests.load.client import RequestResult, carries_token, send
from load_tests.load.outcomes import Outcome
from load_tests.plan.slo import Slo
from load_tests.plan.workload import RequestSpec
from testkit import echo_server

TTFT_MS, ITL_MS, TOKENS = 150.0, 5.0, 8


def spec(i: int, prompt: str, stream: bool, chat: bool) -> RequestSpec:
    route = "/v1/chat/completions" if chat else "/v1/completions"
    body = {
        "model": "fixture",
        "max_tokens": TOKENS,
        "stream": stream,
        **({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}),
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return RequestSpec(i, route, body, stream=stream)


async def send_all(specs: list[RequestSpec]) -> list[RequestResult]:
    runner, _server, port = await echo_server.start(itl_ms=ITL_MS, ttft_ms=TTFT_MS)
    try:
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(send(session, f"http://127.0.0.1:{port}", s, t0=0.0) for s in specs)))
    finally:
        await runner.cleanup()


def test_empty_text_tokens_and_unstreamed_requests_all_have_their_figures_and_count_for_goodput():
    kinds = [
        (p, stream, chat) for p in ("count 1 2", "!empty-text") for stream in (True, False) for chat in (False, True)
    ]
    results = asyncio.run(send_all([spec(i, *k) for i, k in enumerate(kinds)]))
    assert [r.outcome for r in results] == ["ok"] * len(kinds)
    streams = [r for r in results if r.spec["stream"]]
    for r in streams:
        # the first token, empty text or not, 150 ms in; chat's role announcement (sent at once) is not it
        assert r.ttft is not None and r.ttft >= TTFT_MS / 1000, r
        assert r.chunks == TOKENS and len(r.itl) == TOKENS - 1 and r.tpot is not None, r
    for r in results:
        assert r.output_tokens == TOKENS and r.e2e is not None and r.e2e >= (TTFT_MS + ITL_MS * (TOKENS - 1)) / 1000
    slo = Slo(ttft_s=1.0, tpot_s=0.1)  # every request finished within 1 s at well under 0.1 s a token
    tp = throughput(results, wall_s=2.0, slo=slo)
    assert tp.completed == tp.slo_met == len(results) and tp.goodput_requests_per_s == tp.requests_per_s
    lat = latency(results)
    assert (lat.ttft.requests, lat.tpot.requests, lat.e2e.requests) == (len(streams), len(streams), len(results))
    assert lat.itl.requests == len(streams) and lat.itl.count == len(streams) * (TOKENS - 1)


def test_a_tight_slo_is_missed_by_streams_and_unstreamed_requests_alike():
    kinds = [("!empty-text", True, False), ("!empty-text", False, False)]
    results = asyncio.run(send_all([spec(i, *k) for i, k in enumerate(kinds)]))
    # the first token takes 150 ms, over the stream's TTFT target and over the 57 ms budget of 8 unstreamed tokens
    tp = throughput(results, wall_s=1.0, slo=Slo(ttft_s=0.05, tpot_s=0.001))
    assert tp.completed == 2 and tp.slo_met == 0


def test_which_chunks_carry_a_token():
    assert carries_token({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert carries_token({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    assert carries_token({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]})
    assert carries_token({"choices": [{"index": 0, "delta": {"content": " 4"}}]})
    assert not carries_token({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    assert not carries_token({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    assert not carries_token({"choices": [], "usage": {"completion_tokens": 3}})
    assert not carries_token({"id": "x"})


def made(stream: bool, e2e: float, tokens: int, ttft: float | None = None, outcome: Outcome = "ok") -> RequestResult:
    return RequestResult(
        index=0, outcome=outcome, ttft=ttft, e2e=e2e, completion_tokens=tokens, spec={"stream": stream}
    )


def test_the_rule_for_requests_without_a_ttft():
    slo = Slo(ttft_s=2.0, tpot_s=0.2)
    assert slo.met(made(False, e2e=2.0 + 0.2 * 9, tokens=10))  # the latest a stream meeting both could end
    assert not slo.met(made(False, e2e=2.0 + 0.2 * 9 + 0.01, tokens=10))
    assert slo.met(made(False, e2e=2.0, tokens=1)) and not slo.met(made(False, e2e=2.01, tokens=1))
    assert Slo(ttft_s=2.0, tpot_s=0.2, e2e_s=1.0).met(made(False, e2e=0.9, tokens=10))
    assert not Slo(ttft_s=2.0, tpot_s=0.2, e2e_s=1.0).met(made(False, e2e=1.1, tokens=10))
    assert Slo(ttft_s=None, tpot_s=None).met(made(False, e2e=99.0, tokens=10)), "no target: nothing to miss"
    assert not slo.met(made(False, e2e=0.1, tokens=10, outcome="cancelled")), "only complete answers count"


@given(
    ttft=st.floats(0.0, 5.0),
    tpot=st.floats(0.0, 0.5),
    tokens=st.integers(1, 200),
    ttft_s=st.floats(0.1, 5.0),
    tpot_s=st.floats(0.01, 0.5),
)
def test_an_answer_is_judged_alike_streamed_or_not(ttft, tpot, tokens, ttft_s, tpot_s):
    """A stream that meets TTFT and TPOT ends within the budget a non-streamed answer of its length is given:
    switching streaming off never turns a met request into a missed one."""
    e2e = ttft + tpot * (tokens - 1)
    slo = Slo(ttft_s=ttft_s, tpot_s=tpot_s)
    if slo.met(made(True, e2e=e2e, tokens=tokens, ttft=ttft)):
        assert slo.met(made(False, e2e=e2e * (1 - 1e-9), tokens=tokens))
