"""The ``stats_thread`` patch (opt-in): an async engine's stat loggers record on a thread of their own, in order, and
lose nothing; by default they record on the event loop, as upstream.

The recorder's logic is tested on plain callables; what the patch claims of vLLM is tested on a real ``AsyncLLM``
(``testkit.async_engine_probe``), patched and with the patch switched off (the control that fails when it is off).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from patches.framework.switches import OFF_ENV
from patches.stats_thread import ENABLE_ENV, RECORDER_ATTR, StatsRecorder, opted_in, threaded_manager_cls
from testkit.child_probe import run_probe


def test_calls_run_in_order_on_the_recorder_thread_and_close_finishes_them():
    seen: list[tuple[int, str]] = []
    recorder = StatsRecorder(name="probe-stats")
    for i in range(500):
        recorder.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert recorder.close(timeout=10)
    assert [i for i, _ in seen] == list(range(500)), "every call, in the order submitted"
    assert {name for _, name in seen} == {"probe-stats"}
    assert not recorder.alive


def test_a_failing_call_is_logged_and_the_next_ones_still_run(caplog):
    seen: list[int] = []

    def boom():
        raise ValueError("Counters can only be incremented by non-negative amounts.")

    recorder = StatsRecorder()
    with caplog.at_level(logging.ERROR):
        recorder.submit(boom)
        recorder.submit(seen.append, 1)
        recorder.submit(boom)
        recorder.submit(seen.append, 2)
        assert recorder.close(timeout=10)
    assert seen == [1, 2]
    assert recorder.failures == {"ValueError": 2}
    logged = [r for r in caplog.records if "stats_thread" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info, "the first failure of a kind, with its traceback"


def test_a_full_queue_makes_the_submitter_wait_for_the_thread():
    release = threading.Event()
    recorder = StatsRecorder(maxsize=1)
    recorder.submit(release.wait)  # taken by the thread, which then waits
    time.sleep(0.2)
    recorder.submit(lambda: None)  # fills the queue
    third = threading.Thread(target=recorder.submit, args=(lambda: None,))
    third.start()
    third.join(0.3)
    assert third.is_alive(), "a submit into a full queue waits"
    release.set()
    third.join(5)
    assert not third.is_alive()
    assert recorder.close(timeout=5)


def test_the_threaded_manager_hands_record_and_log_to_its_recorder():
    calls: list[tuple[str, tuple, dict, str]] = []

    class Manager:
        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=None):
            calls.append(("record", (scheduler_stats, iteration_stats), {"engine_idx": engine_idx}, _thread()))

        def log(self):
            calls.append(("log", (), {}, _thread()))

    manager = Manager()
    recorder = StatsRecorder(name="probe-stats")
    setattr(manager, RECORDER_ATTR, recorder)
    manager.__class__ = threaded_manager_cls(Manager)
    assert threaded_manager_cls(Manager) is type(manager) and isinstance(manager, Manager)
    manager.record("s", "i", engine_idx=0)
    manager.log()
    assert recorder.close(timeout=5)
    assert calls == [
        ("record", ("s", "i"), {"engine_idx": 0}, "probe-stats"),
        ("log", (), {}, "probe-stats"),
    ]


def _thread() -> str:
    return threading.current_thread().name


def _probe(model, env: dict[str, str]) -> dict:
    return run_probe("testkit.async_engine_probe", str(model), env=env)


@pytest.mark.engine
@pytest.mark.parametrize(
    "env, threaded",
    [({ENABLE_ENV: "1", OFF_ENV: ""}, True), ({ENABLE_ENV: "", OFF_ENV: ""}, False)],
    ids=["opted_in", "default"],
)
def test_a_real_async_engine_records_off_its_event_loop_and_loses_nothing(fixture_model, env, threaded):
    """Opted in, the stat loggers record on the patch's thread; by default (the control) on the event loop's, as
    upstream; either way every token the requests saw is in the steps' figures."""
    seen = _probe(fixture_model, env)
    loop = seen["loop_thread"]
    if not threaded:
        assert seen["manager_class"] == "StatLoggerManager"
        assert set(seen["record_threads"]) == {loop}, seen
    else:
        assert seen["manager_class"] == "ThreadedStatLoggerManager"
        assert set(seen["record_threads"]) == {"fuzzserve-stats"}, seen
        assert set(seen["log_threads"]) == {"fuzzserve-stats"}, seen
    assert sum(seen["log_threads"].values()) == 1, seen
    assert seen["steps_prompt_tokens"] == seen["requests_prompt_tokens"] > 0, seen
    assert seen["steps_generation_tokens"] == seen["requests_generation_tokens"] > 0, seen


def test_the_patch_is_opt_in(monkeypatch):
    monkeypatch.delenv(ENABLE_ENV, raising=False)
    assert not opted_in()
    for value, on in (("1", True), (" 1 ", True), ("0", False), ("true", False), ("", False)):
        monkeypatch.setenv(ENABLE_ENV, value)
        assert opted_in() is on, value
