"""benchmarks.investigations.run_queue_wait: reading threads' scheduler counters (a planted /proc tree, and this
process's own: a spinning thread runs, a sleeping one does not), the server's histograms, the client's figures."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from benchmarks.investigations import run_queue_wait as rqw


def plant(proc: Path, pid: int, comm: str, threads: dict[int, tuple[str, str]]) -> None:
    (proc / str(pid) / "task").mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(comm + "\n")
    for tid, (name, schedstat) in threads.items():
        d = proc / str(pid) / "task" / str(tid)
        d.mkdir()
        (d / "comm").write_text(name + "\n")
        (d / "schedstat").write_text(schedstat + "\n")


def test_thread_times_and_rates_from_a_planted_proc(tmp_path):
    before_dir, after_dir = tmp_path / "a", tmp_path / "b"
    plant(before_dir, 10, "VLLM::Worker", {10: ("VLLM::Worker", "1000000000 0 10"), 11: ("gloo", "0 0 1")})
    plant(after_dir, 10, "VLLM::Worker", {10: ("VLLM::Worker", "2800000000 400000000 900"), 12: ("new", "5 5 5")})
    a = rqw.thread_times([10, 99], before_dir)  # 99: gone, left out
    b = rqw.thread_times([10], after_dir)
    assert set(a) == {(10, 10), (10, 11)} and a[10, 10].process == "VLLM::Worker"
    rows = rqw.per_second(a, b, seconds=2.0)
    assert rows == [
        {
            "pid": 10,
            "tid": 10,
            "process": "VLLM::Worker",
            "thread": "VLLM::Worker",
            "ran": 0.9,
            "waited": 0.2,
            "slices": 890,
        }
    ]  # thread 11 ended, 12 started inside the window: neither has a rate


def test_a_spinning_thread_runs_and_a_sleeping_one_does_not():
    """The real /proc: the positive control (it can see a thread run) and the negative one."""
    stop = threading.Event()
    ids: dict[str, int] = {}

    def spin() -> None:
        ids["spin"] = threading.get_native_id()
        while not stop.is_set():
            pass

    def sleep() -> None:
        ids["sleep"] = threading.get_native_id()
        stop.wait()

    workers = [threading.Thread(target=spin), threading.Thread(target=sleep)]
    for w in workers:
        w.start()
    while len(ids) < 2:
        time.sleep(0.01)
    a = rqw.thread_times([os.getpid()])
    time.sleep(0.3)
    b = rqw.thread_times([os.getpid()])
    stop.set()
    for w in workers:
        w.join()
    rows = {r["tid"]: r for r in rqw.per_second(a, b, 0.3)}
    assert rows[ids["spin"]]["ran"] > 0.05  # it shares the GIL with this thread, so not a whole core
    assert rows[ids["sleep"]]["ran"] < 0.01


METRICS = """# HELP vllm:time_to_first_token_seconds ttft
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="fixture"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="fixture"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="fixture"} 0.048
# HELP vllm:e2e_request_latency_seconds e2e
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="fixture"} 4.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="fixture"} 0.8
"""


def test_histogram_means_over_a_window():
    before = rqw.histogram_totals("")
    after = rqw.histogram_totals(METRICS)
    means = rqw.histogram_means_ms(before, after)
    assert abs(means["vllm:time_to_first_token_seconds"]["mean_ms"] - 12.0) < 1e-9
    assert abs(means["vllm:e2e_request_latency_seconds"]["mean_ms"] - 200.0) < 1e-9
    assert means["vllm:request_queue_time_seconds"] == {"mean_ms": None, "count": 0}


def test_client_summary_and_report():
    reqs = [{"headers_s": 0.005, "ttft_s": t, "e2e_s": t + 0.2} for t in (0.01, 0.02, 0.03, 0.2)]
    c = rqw.client_summary(reqs)
    assert c["ttft_p50"] == 30.0 and c["ttft_max"] == 200.0 and abs(c["ttft_mean"] - 65.0) < 1e-9
    hist = rqw.histogram_means_ms(rqw.histogram_totals(""), rqw.histogram_totals(METRICS))
    phase = {
        "client_sched": "SCHED_FIFO 1",
        "client": c,
        "server_histograms": hist,
        "client_thread": {"ran": 0.04, "waited": 0.0, "slices": 10},
        "server_threads": [{"process": "p", "thread": "t", "ran": 0.9, "waited": 0.1, "slices": 5}],
    }
    md = rqw.report({"arm": "plain", "date": "d", "command": "c"}, [phase])
    assert "| SCHED_FIFO 1 | 30.0 / 65.0 / 200.0 / 200.0 |" in md and "| 12.0 / 200.0 |" in md
    assert "| p | t | 0.900 | 0.100 | 5 |" in md
