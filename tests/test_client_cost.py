"""The client's own cost (issue 47): its loop's lag and CPU are measured, and its ITL / TPOT are withheld, never a
0 ms percentile, when it read token chunks late or in bursts; its rates stand beside the engines' own counts.

Against ``testkit/echo_server.py`` (real HTTP, deterministic token pace) with the client's loop left free (the
figures are reported and match the server's pace) and with it blocked on purpose (they are withheld), and on
hand-made results for the rules themselves.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from load_tests.judge.figures import latency
from load_tests.judge.summary import server_cross_check
from load_tests.load.client import RequestResult, send
from load_tests.load.client_cost import LAG_BOUND_S, LoopLag, ProcessCpu, reads_late
from load_tests.observe.counters import ReplicaCounters
from load_tests.plan.workload import RequestSpec
from testkit import echo_server

ITL_MS, TOKENS = 5.0, 12


def stream_spec(i: int) -> RequestSpec:
    body = {
        "model": "fixture",
        "prompt": "count 1 2",
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return RequestSpec(i, "/v1/completions", body, stream=True)


async def streams(block_ms: float) -> tuple[list[RequestResult], list[float]]:
    """8 streams against the echo server while a task blocks the client's loop for ``block_ms`` every 20 ms."""
    runner, _server, port = await echo_server.start(itl_ms=ITL_MS, ttft_ms=10.0)
    lag = LoopLag()
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            time.sleep(block_ms / 1000)  # noqa: ASYNC251 -- blocks the loop on purpose: as a saturated client
            await asyncio.sleep(0.02)

    try:
        lag.start()
        hogging = asyncio.create_task(hog())
        async with aiohttp.ClientSession() as session:
            results = await asyncio.gather(
                *(send(session, f"http://127.0.0.1:{port}", stream_spec(i), t0=0.0) for i in range(8))
            )
        stop.set()
        await hogging
        await lag.stop()
        return list(results), lag.lags
    finally:
        await runner.cleanup()


def p99(xs: list[float]) -> float:
    return sorted(xs)[int(0.99 * (len(xs) - 1))]


def test_a_client_on_time_reports_the_servers_pace():
    results, lags = asyncio.run(streams(block_ms=0.0))
    assert [r.outcome for r in results] == ["ok"] * 8
    assert p99(lags) < LAG_BOUND_S
    lat = latency(results, p99(lags))
    assert lat.itl.note is None and lat.tpot.note is None
    assert lat.itl.p50 is not None
    assert 0.8 * ITL_MS / 1000 < lat.itl.p50 < 3 * ITL_MS / 1000, lat.itl  # the echo server's 5 ms pace


def test_a_client_whose_loop_runs_late_withholds_itl_and_tpot_and_says_why():
    results, lags = asyncio.run(streams(block_ms=30.0))
    assert [r.outcome for r in results] == ["ok"] * 8
    assert p99(lags) > 0.02, "the probe sees the loop blocked for 30 ms at a time"
    lat = latency(results, p99(lags))
    assert (lat.itl.p50, lat.itl.p99, lat.itl.mean) == (None, None, None) and lat.itl.count > 0
    assert lat.itl.note is not None
    assert lat.itl.note.startswith("withheld: the client's event loop ran") and "read token chunks late" in lat.itl.note
    # TPOT spreads the lag over a stream's 12 tokens: withheld only when that share is over a tenth of it
    assert lat.tpot.note is None or "per token over a median stream" in lat.tpot.note
    note = latency(results, 0.5).tpot.note
    assert note is not None and note.startswith("withheld: the client's event loop ran 500.0 ms late")
    assert lat.ttft.p50 is not None and lat.ttft.note is None, "TTFT stays: a late read only makes it longer"
    # the control: the same results judged as if the loop had been on time keep their figures
    assert latency(results, 0.001).itl.p50 is not None


def test_chunks_read_in_bursts_are_withheld_even_without_a_lag_measurement():
    burst = RequestResult(
        index=0, outcome="ok", ttft=0.5, e2e=0.5001, itl=[6e-6] * 63, completion_tokens=64, spec={"stream": True}
    )
    lat = latency([burst])
    assert lat.itl.p50 is None and lat.itl.note is not None and "arrived in bursts (median gap 6 us" in lat.itl.note
    assert lat.tpot.p50 is None, "TPOT of 0 ms is never shown"
    assert reads_late(None, 0.004) is None and reads_late(0.004, 0.004) is None
    note = reads_late(0.006, 0.004)
    assert note is not None and note.startswith("withheld: the client's event loop ran 6.0 ms late")
    from load_tests.load.client_cost import tpot_reads_late

    assert tpot_reads_late(0.006, 0.004, 0.010, 32) is None, "6 ms over 31 tokens is 2 % of a 10 ms TPOT"
    note = tpot_reads_late(0.1, 0.004, 0.010, 32)
    assert note is not None and "per token over a median stream" in note
    note = tpot_reads_late(None, 6e-6, 0.0, 64)
    assert note is not None and "bursts" in note


def test_process_cpu_counts_this_processes_work():
    cpu = ProcessCpu()
    cpu.start()
    t = time.perf_counter()
    while time.perf_counter() - t < 0.2:
        pass
    assert 0.1 < cpu.stop() < 1.0


def test_the_clients_rate_stands_beside_the_engines_and_is_flagged_when_it_differs():
    ok = [RequestResult(index=i, outcome="ok", completion_tokens=10, spec={"stream": True}) for i in range(100)]

    def engines(completed: float, tokens: float) -> dict[str, ReplicaCounters]:
        return {"r1": ReplicaCounters(replica="r1", requests_finished={"length": completed}, generation_tokens=tokens)}

    same = server_cross_check(ok, engines(100, 1000), False, wall_s=10.0, output_tokens=1000)
    assert (same.client_requests_per_s, same.engine_requests_per_s) == (10.0, 10.0) and same.agrees
    assert (same.client_output_tokens_per_s, same.engine_output_tokens_per_s) == (100.0, 100.0)
    fewer = server_cross_check(ok, engines(90, 900), False, wall_s=10.0, output_tokens=1000)
    assert not fewer.agrees and fewer.engine_requests_per_s == 9.0
    cancelled = ok + [RequestResult(index=100 + i, outcome="cancelled", spec={"stream": True}) for i in range(10)]
    assert server_cross_check(cancelled, engines(110, 1100), False, wall_s=10.0).agrees, (
        "a cancelled stream the engine completed counts on the engines' side"
    )
