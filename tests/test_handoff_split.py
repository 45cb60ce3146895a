"""The hand-off split (benchmarks.investigations.handoff_split) on planted traces, and its hooks on vLLM's real
frontend classes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import time

import pytest

from benchmarks.harness.arms import ProtocolError
from benchmarks.investigations import handoff_split as hs
from patches.framework.switches import ALL, OFF_ENV


def _record(arrival=0.0, sent=0.002, queued=0.010, scheduled=0.0101, core_out=0.020, got=0.021, ttft=None):
    rec = {
        "rid": "r",
        "arrival": arrival,
        "sent": sent,
        "queued": queued,
        "scheduled": scheduled,
        "core_out": core_out,
        "got": got,
        "done": got + 0.0002,
    }
    rec["ttft"] = (got - arrival) if ttft is None else ttft
    return rec


def test_a_request_sent_during_a_step_waited_for_it_and_the_parts_sum_to_vllms_ttft():
    # sent at 2 ms; the step running then ended at 9 ms; queued at 10 ms
    parts = hs.split_request(_record(), step_ends=[0.001, 0.009, 0.020])
    assert parts is not None
    assert parts["front_in"] == pytest.approx(2.0)
    assert parts["in_step"] == pytest.approx(7.0)
    assert parts["to_core"] == pytest.approx(1.0)
    assert parts["queue"] == pytest.approx(0.1)
    assert parts["prefill"] == pytest.approx(9.9)
    assert parts["from_core"] == pytest.approx(1.0)
    assert parts["waited"] == 1.0
    assert parts["check"] == pytest.approx(0.0, abs=1e-9)


def test_a_request_sent_to_an_idle_engine_waited_for_no_step():
    # the last step ended before the request was sent: everything up to queued is transit
    parts = hs.split_request(_record(), step_ends=[0.001, 0.020])
    assert parts is not None
    assert parts["in_step"] == 0.0 and parts["waited"] == 0.0
    assert parts["to_core"] == pytest.approx(8.0)
    parts = hs.split_request(_record(), step_ends=[])
    assert parts is not None
    assert parts["in_step"] == 0.0 and parts["to_core"] == pytest.approx(8.0)


def test_check_sees_parts_that_do_not_add_up_to_vllms_own_ttft():
    # positive control: vLLM said 25 ms, the timestamps span 21 ms
    parts = hs.split_request(_record(ttft=0.025), [0.009])
    assert parts is not None
    assert parts["check"] == pytest.approx(-4.0)


def test_a_record_missing_a_timestamp_is_not_split_and_is_counted_as_untraced():
    rec = _record()
    rec["sent"] = None
    assert hs.split_request(rec, [0.009]) is None
    out = hs.summarize([_record(), rec], [{"step": 0.009}, {"step": 0.020}])
    assert out["requests"] == 1 and out["untraced"] == 1


def test_summarize_means_the_parts_and_reads_the_step_cycle_inside_the_run():
    reqs = [_record(), _record(arrival=0.1, sent=0.102, queued=0.110, scheduled=0.1101, core_out=0.120, got=0.121)]
    steps = [{"step": t} for t in (0.009, 0.012, 0.015, 0.018, 0.109, 0.112, 0.115, 5.0)]
    out = hs.summarize(reqs, steps)
    assert out["requests"] == 2 and out["in_step"] == pytest.approx(7.0)
    assert out["server"] == pytest.approx(21.0)
    assert out["steps"] == 7  # the step at 5 s lies outside the run
    assert out["step_cycle_ms"] == pytest.approx(3.0)


def test_each_request_is_set_against_its_own_engines_steps_when_replicas_share_a_trace():
    # replica 1 sent at 2 ms and its engine's step ended at 9 ms; replica 2's engine ended a step at 9.5 ms
    reqs = [{**_record(), "pid": 1}]
    steps = [
        {"step": 0.009, "pid": 1},
        {"step": 0.0095, "pid": 2},
        {"step": 0.012, "pid": 1},
        {"step": 0.0125, "pid": 2},
    ]
    out = hs.summarize(reqs, steps)
    assert out["in_step"] == pytest.approx(7.0) and out["to_core"] == pytest.approx(1.0)
    assert out["step_cycle_ms"] == pytest.approx(3.0)  # not the 0.5 ms between the two engines' steps
    mixed = hs.summarize([_record()], [{"step": t} for t in (0.009, 0.0095, 0.012, 0.0125)])
    assert mixed["in_step"] == pytest.approx(7.5), "without pids every step counts (a single engine's trace)"


def test_partition_gives_each_run_its_own_requests_in_order_and_refuses_a_count_that_does_not_match():
    reqs = [
        _record(arrival=t, sent=t + 0.002, queued=t + 0.01, scheduled=t + 0.0101, core_out=t + 0.02, got=t + 0.021)
        for t in (0.0, 1.0, 2.0, 3.0)
    ]
    steps = [{"step": t + 0.009} for t in (0.0, 1.0, 2.0, 3.0)]
    warm, run1 = hs.partition(reqs, steps, [1, 3])
    assert warm[0] == reqs[:1] and run1[0] == reqs[1:]
    assert [s["step"] for s in run1[1]] == [1.009, 2.009, 3.009]
    with pytest.raises(ProtocolError, match="4 first tokens"):
        hs.partition(reqs, steps, [1, 2])


def test_by_arm_takes_the_median_over_runs_and_leaves_void_runs_out():
    def result(arm, pair, front_in, void=None):
        return {
            "arm": arm,
            "pair": pair,
            "label": "c8",
            "void": void,
            "split": {
                "requests": 10,
                **dict.fromkeys(hs.PARTS, 1.0),
                "front_in": front_in,
                "server": 6.0,
                "check": 0.0,
                "waited_share": 0.5,
                "step_cycle_ms": 2.0,
            },
        }

    table = hs.by_arm(
        [
            result("plain", 0, 1.0),
            result("plain", 1, 3.0),
            result("plain", 2, 100.0, void="hits"),
            result("engine", 0, 2.0),
        ]
    )
    assert table["c8"]["plain"]["front_in"] == 2.0 and table["c8"]["plain"]["runs"] == 2
    assert table["c8"]["plain"]["requests"] == 20 and table["c8"]["engine"]["front_in"] == 2.0


def test_every_arm_is_traced_through_its_environment_and_nothing_else_is(tmp_path, monkeypatch):
    from benchmarks.harness.arms import Shipped, VllmServer
    from benchmarks.investigations.handoff_hooks import PLUGIN_DIR, TRACE_ENV

    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    server = hs.traced(VllmServer("plain", tmp_path, tmp_path, [], {OFF_ENV: ALL}), tmp_path / "t")
    assert server.env == {
        OFF_ENV: ALL,
        TRACE_ENV: str(tmp_path / "t"),
        "PYTHONPATH": f"{os.pathsep.join([str(PLUGIN_DIR), '/elsewhere'])}",
    }
    shipped = hs.traced(Shipped(tmp_path / "config.yaml", tmp_path), tmp_path / "s")
    assert shipped.env[TRACE_ENV] == str(tmp_path / "s") and shipped.env["PYTHONPATH"].startswith(str(PLUGIN_DIR))
    with pytest.raises(ProtocolError, match="not an arm"):
        hs.traced(object(), tmp_path / "t")  # type: ignore[arg-type]  # a wrong type on purpose: traced refuses it


def test_vllm_loads_the_hooks_as_a_plugin_only_where_the_benchmark_puts_them(tmp_path):
    """The plugin's metadata lies outside every installed package: the project's environment does not see it
    (negative control, in-process); a Python process started with plugin_env() does, and vLLM's own plugin
    loader installs the wrappers there (a real vLLM import, in a child process)."""
    import importlib.metadata
    import subprocess
    import sys

    from benchmarks.investigations.handoff_hooks import plugin_env

    names = {ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert "handoff_trace" not in names and names, "the installed environment must not load the hooks"
    trace = tmp_path / "trace.jsonl"
    probe = (
        "from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "from vllm.v1.engine.output_processor import OutputProcessor; "
        "print(getattr(OutputProcessor.process_outputs, '_handoff_traced', False))"
    )
    env = {**os.environ, **plugin_env(trace, os.environ.get("PYTHONPATH")), OFF_ENV: ALL}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "True"
    assert trace.exists() and trace.read_text() == "", "installed, and nothing written without a request"


def test_the_hooks_record_vllms_own_timestamps_through_its_real_frontend_classes(tmp_path, handoff_originals):
    """vLLM's OutputProcessor and AsyncMPClient, wrapped by install(): a request's first token is written with
    the EngineCore events it carried, later tokens are not, and every step output is."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, EngineCoreRequest
    from vllm.v1.engine.core_client import AsyncMPClient
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    from benchmarks.investigations import handoff_hooks

    trace = tmp_path / "trace.jsonl"
    handoff_hooks.install(trace)
    handoff_hooks.install(trace)  # idempotent
    assert getattr(OutputProcessor.process_outputs, "_handoff_traced", False)  # the mark install() sets

    request = EngineCoreRequest(
        request_id="r1",
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=4, detokenize=False, output_kind=RequestOutputKind.DELTA),
        pooling_params=None,
        arrival_time=time.time(),
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id="r1",
    )

    class Client:  # the socket side of AsyncMPClient, which needs a running EngineCore
        client_index = 0

        async def _send_input(self, *args):
            pass

        def _ensure_output_queue_task(self):
            pass

    asyncio.run(AsyncMPClient.add_request_async(Client(), request))
    processor = OutputProcessor(None, log_stats=True)
    processor.add_request(request, None)
    t = time.monotonic()
    events = [
        EngineCoreEvent(EngineCoreEventType.QUEUED, t + 0.001),
        EngineCoreEvent(EngineCoreEventType.SCHEDULED, t + 0.002),
    ]
    processor.process_outputs(
        [EngineCoreOutput(request_id="r1", new_token_ids=[7], events=events)], t + 0.010, IterationStats()
    )
    processor.process_outputs([EngineCoreOutput(request_id="r1", new_token_ids=[8])], t + 0.012, IterationStats())
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    steps = [r for r in lines if "step" in r]
    firsts = [r for r in lines if "rid" in r]
    assert [s["step"] for s in steps] == [t + 0.010, t + 0.012] and [s["first"] for s in steps] == [1, 0]
    assert len(firsts) == 1
    rec = firsts[0]
    assert rec["queued"] == t + 0.001 and rec["scheduled"] == t + 0.002 and rec["core_out"] == t + 0.010
    assert rec["sent"] is not None and rec["arrival"] <= rec["sent"] <= rec["got"] <= rec["done"]
    assert rec["pid"] == os.getpid() and {s["pid"] for s in steps} == {os.getpid()}
    assert math.isclose(rec["got"] - rec["arrival"], rec["ttft"], abs_tol=0.005)
