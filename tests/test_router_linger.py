"""load_tests/report/router_linger.py: the routing calls a stopped router answered later than Serve's default drain,
read from Serve's own log lines (their format copied from a redeploy's logs, 2026-11-27)."""

from __future__ import annotations

import datetime as dt

from load_tests.report.router_linger import SERVE_DEFAULT_DRAIN_S, late_calls, read_logs, router_stops

STOP = (
    "INFO 2026-11-27 10:16:16,293 controller 25119 -- Stopping Replica(id='33pupt9m', deployment='LLMRouter', "
    "app='fuzzserve') (currently ReplicaState.RUNNING).\n"
)
ENGINE_STOP = STOP.replace("'33pupt9m', deployment='LLMRouter'", "'abcd1234', deployment='LLMServer:fixture'")


def call(stamp: str, status: int = 200) -> str:
    return f"INFO 2026-11-27 {stamp} fuzzserve_LLMRouter 33pupt9m 5bfe897f-a423 -- POST __call__ {status} 13.3ms\n"


def test_only_calls_past_the_default_drain_count():
    [(router, stopped)] = router_stops([STOP, ENGINE_STOP]).items()  # an engine's stop is not a router's
    assert router == "33pupt9m" and stopped == dt.datetime(2026, 11, 27, 10, 16, 16, 293000)
    lines = [
        call("10:16:10,000"),
        call("10:16:18,000"),
        call("10:16:18,400"),
        call("10:16:29,172"),
        call("10:16:29,500", status=503),
        "INFO 2026-11-27 10:16:46,297 ... Drained ongoing requests\n",
    ]
    late = late_calls(router, stopped, lines)
    # 10:16:18,000 is 1.707 s after the stop (within Serve's default), the 503 is no answered routing call
    assert [round(s, 3) for s in late.late_s] == [2.107, 12.879]
    assert all(s > SERVE_DEFAULT_DRAIN_S for s in late.late_s)


def test_read_logs_pairs_each_router_with_its_own_log(tmp_path):
    (tmp_path / "controller_1.log").write_text(STOP + ENGINE_STOP)
    (tmp_path / "replica_fuzzserve_LLMRouter_33pupt9m.log").write_text(call("10:16:20,000") * 3)
    (tmp_path / "replica_fuzzserve_LLMRouter_other.log").write_text(call("10:16:20,000") * 5)  # never stopped
    [row] = read_logs(tmp_path)
    assert row.router == "33pupt9m" and len(row.late_s) == 3
    (tmp_path / "replica_fuzzserve_LLMRouter_33pupt9m.log").write_text(call("10:16:17,000"))  # within the default
    assert read_logs(tmp_path)[0].late_s == ()
