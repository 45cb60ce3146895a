"""The knee comparison's rules (benchmarks.knee_agreement), fixed before its data: the server's knee over a run's
step rates, and when two knees agree."""

from __future__ import annotations

from benchmarks.knee_agreement import server_knee, steps_up_to, verdict, window_rate, within_one_step

STEPS = steps_up_to(256)


def test_the_steps_double_up_to_the_top():
    assert STEPS == [1, 2, 4, 8, 16, 32, 64, 128, 256] and steps_up_to(3) == [1, 2]


def test_the_servers_knee_is_the_lowest_step_near_its_highest_rate():
    flat_from_32 = {1: 15.0, 2: 25.0, 4: 40.0, 8: 70.0, 16: 100.0, 32: 120.0, 64: 124.0, 128: 126.0, 256: 125.0}
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
