"""The knee comparison's rules (benchmarks.knee_agreement), fixed before its data: the server's knee over a run's
step rates, and when two knees agree."""

from __future__ import annotations

from benchmarks.knee_agreement import server_knee, steps_up_to, verdict, window_rate, within_one_step

STEPS = steps_up_to(256)
Rates = dict[int, float | None]  # a run's server rate per step (None: a step without one)


def test_the_steps_double_up_to_the_top():
    assert STEPS == [1, 2, 4, 8, 16, 32, 64, 128, 256] and steps_up_to(3) == [1, 2]


def test_the_servers_knee_is_the_lowest_step_near_its_highest_rate():
    flat_from_32: Rates = {1: 15.0, 2: 25.0, 4: 40.0, 8: 70.0, 16: 100.0, 32: 120.0, 64: 124.0, 128: 126.0, 256: 125.0}
    assert server_knee(flat_from_32) == 32
    rising = {**flat_from_32, 256: 150.0}  # the top step still gains 19 %: no knee within the steps
    assert server_knee(rising) is None
    assert server_knee({1: None, 2: None}) is None, "no step with a server rate: nothing to say"


def test_knees_agree_within_one_step_or_when_neither_finds_one():
    assert within_one_step(32, 64, STEPS) and not within_one_step(32, 128, STEPS)
    assert (
        within_one_step(None, None, STEPS) and within_one_step(None, 256, STEPS) and within_one_step(128, None, STEPS)
    )
    assert not within_one_step(None, 64, STEPS)
    # our search names its top step when goodput is best there; GuideLLM finds none: both say "not below 256"
    assert verdict(256, None, {"ours": None, "guidellm": None}, STEPS) == "agree: no knee below 256 in flight"
    assert verdict(32, 64, {"ours": 32, "guidellm": 32}, STEPS) == "agree"
    assert verdict(256, 32, {"ours": 32, "guidellm": 32}, STEPS) == ("disagree; the server's counts support GuideLLM's")
    assert verdict(256, 16, {"ours": None, "guidellm": 128}, STEPS) == "disagree; the server's counts support ours"
    assert verdict(8, 128, {"ours": 32, "guidellm": 32}, STEPS).endswith("neither")


def test_a_steps_server_rate_is_read_inside_its_window_only():
    # 10 requests/s from t=0 to t=60 (an export every 10 s), then 40/s from t=60 to t=120
    samples = [(float(t), 10.0 * min(t, 60) + 40.0 * max(t - 60, 0)) for t in range(121)]
    exported = [(t, samples[int(t) // 10 * 10][1]) for t, _ in samples]
    assert window_rate(exported, 0, 60) == 10.0 and window_rate(exported, 60, 120) == 40.0
    assert window_rate(exported, 0, 12) is None, "one export in the window: no rate"


def report(ttft_ms: float, streams: int = 32) -> dict:
    """A GuideLLM 0.8.1 JSON report, cut to the fields the benchmarks read (their paths as the echo run wrote
    them: docs/results_log.md, 2026-11-28 11:42)."""
    pct = lambda v: {"successful": {"percentiles": {"p50": v, "p99": 2 * v}}}  # noqa: E731
    return {
        "benchmarks": [
            {
                "config": {"strategy": {"streams": streams}},
                "start_time": 100.0,
                "end_time": 116.5,
                "metrics": {
                    "request_totals": {"successful": 640, "errored": 0},
                    "requests_per_second": {"successful": {"mean": 38.8}},
                    "time_to_first_token_ms": pct(ttft_ms),
                    "inter_token_latency_ms": pct(ttft_ms / 10),
                },
            }
        ],
        "conclusions": [
            {"kind": "knee_detection", "final": {"throughput": {"status": "no_knee", "reason": "still rising"}}}
        ],
    }


def test_guidellms_report_is_read_in_seconds_and_a_0_ms_first_token_is_withheld():
    from benchmarks.harness.guidellm_client import figures, knee_found

    (row,) = figures(report(104.0))
    assert row["requests"] == 640 and row["requests_per_s"] == 38.8 and row["window_s"] == 16.5
    assert row["ttft_p50_s"] == 0.104 and row["tpot_p50_s"] == 0.0104 and row["streams"] == 32
    (blank,) = figures(report(0.0))  # GuideLLM times text: empty text reads 0 ms
    assert blank["ttft_p50_s"] is None and blank["tpot_p50_s"] is None and "withheld" in blank["latency_note"]
    assert knee_found(report(1.0)) == {"status": "no_knee", "reason": "still rising"}
    assert knee_found({"benchmarks": []}) is None


def test_guidellm_is_asked_for_the_same_bodies_and_steps():
    import json
    from pathlib import Path

    from benchmarks.harness.guidellm_client import command, concurrent, knee

    argv = command(
        "http://h:1",
        Path("/d.jsonl"),
        Path("/tok"),
        knee([1, 2, 4, 8, 16]),
        {"kind": "max_duration", "seconds": 45},
        Path("/o.json"),
        binary=Path("/g"),
    )
    opts = dict(zip(argv[2::2], argv[3::2], strict=False))  # the last flag takes no value
    assert argv[:2] == ["/g", "run"] and json.loads(opts["--profile"]) == {
        "kind": "knee",
        "initial_streams": [1, 2, 4, 8, 16],
    }
    backend = json.loads(opts["--backend"])
    assert backend["request_format"] == "/v1/completions" and backend["stream"] is True
    assert json.loads(opts["--data"]) == {"kind": "json_file", "path": "/d.jsonl"}
    assert concurrent(32) == {"kind": "concurrent", "streams": 32}
