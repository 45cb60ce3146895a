"""Markers that tell the truth: a pytest plugin (loaded by tests/conftest.py) that fails a test that starts
a vLLM engine, trains the fixture model or starts a Ray cluster without saying so.

README's fast command, ``-m "not engine"``, promises no engine and no Ray
cluster; that promise holds only if every test that starts one carries the
marker; and the fast command runs every pure test only if no test carries
a marker it does not need. Three checks, each failing the offending test
with a message that names what it started (or did not) and the marker:

* at collection, from the fixtures a test uses (:data:`FIXTURE_MARKERS`):
  a test that uses ``fixture_model`` (which trains the model on a fresh
  clone) or an engine fixture needs ``engine``; one that uses
  ``serve_cluster`` needs ``serve`` and ``engine``. It fails before any
  fixture starts.
* while it runs, from what it actually started: a watcher polls the test
  process's descendants (every :data:`POLL_S`) for vLLM engine processes
  (a ``vllm.entrypoints`` server, the fuzz matrix's engine process, or a process titled ``EngineCore`` that
  has loaded torch: a bare process that only takes the title, as
  ``test_core_binding`` starts, is not an engine) and Ray cluster
  processes (``raylet``, ``gcs_server``, ``ray start``), and
  the model build is caught where it trains (``fixture_model.build.train``,
  in this process). This catches what no fixture says: a CLI run, a
  benchmark's ``main()``, a subprocess. A process started by a fixture is
  charged to the first test that requested the fixture; one started under
  a nested pytest run (a test of this check) is that run's business.
* the other way round, while it runs: a test marked ``engine`` (and not
  ``serve``) that uses no engine fixture and starts no engine and trains
  nothing is a pure test kept out of the fast suite.

Tests that carry both markers are not watched (nothing left to catch).
"""

from __future__ import annotations

import os
import threading

import psutil
import pytest

# fixture -> the markers a test using it must carry
FIXTURE_MARKERS = {
    "fixture_model": {"engine"},
    "start_engine": {"engine"},
    "patched_engine": {"engine"},
    "stock_engine": {"engine"},
    "serve_cluster": {"engine", "serve"},
}
POLL_S = 0.5
_PROBLEM = "_fuzzserve_marker_problem"
_WATCH = "_fuzzserve_watch"


def _loaded_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libtorch" in f.read()
    except OSError:
        return False


def classify(cmdline: list[str], name: str, pid: int | None = None) -> str | None:
    """What a process is, for the markers: ``engine``, ``serve`` (a Ray cluster process) or None."""
    text = " ".join(cmdline)
    # patches.matrix.engine_run: the fuzz matrix's engine process (its EngineCore may run inside it)
    if (
        "vllm.entrypoints" in text
        or "patches.matrix.engine_run" in text
        or (("EngineCore" in name or "EngineCore" in text) and (pid is None or _loaded_torch(pid)))
    ):
        return "engine"
    exe = os.path.basename(cmdline[0]) if cmdline else name
    if (
        exe in ("raylet", "gcs_server")
        or name in ("raylet", "gcs_server")
        or (len(cmdline) > 2 and os.path.basename(cmdline[1]) == "ray" and cmdline[2] == "start")
    ):
        return "serve"
    return None


def _under_nested_pytest(p: psutil.Process, me: psutil.Process) -> bool:
    """A descendant of another pytest run (a test that runs pytest): that run's own check answers for it."""
    for parent in p.parents():
        if parent.pid == me.pid:
            return False
        if any("pytest" in part for part in parent.cmdline()):
            return True
    return False


class Watcher:
    """Polls this process's descendants in a thread; remembers what each new one was."""

    def __init__(self, wanted: set[str]):
        self.wanted = wanted
        self.found: dict[str, str] = {}  # marker -> an example process
        self._seen: set[int] = {p.pid for p in psutil.Process().children(recursive=True)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="marker-watcher")
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            self.poll(me)
            self._stop.wait(POLL_S)

    def poll(self, me: psutil.Process) -> None:
        try:
            children = me.children(recursive=True)
        except psutil.Error:
            return
        for p in children:
            if p.pid in self._seen:
                continue
            try:
                cmdline, name = p.cmdline(), p.name()
                if _under_nested_pytest(p, me):
                    self._seen.add(p.pid)
                    continue
            except psutil.Error:
                continue  # gone already, or a zombie
            kind = classify(cmdline, name, p.pid)
            if kind is None:
                continue  # looked at again next time: a spawned process takes its title (EngineCore) later
            self._seen.add(p.pid)
            if kind in self.wanted:
                self.found.setdefault(kind, f"pid {p.pid}: {' '.join(cmdline)[:120] or name}")

    def stop(self) -> dict[str, str]:
        self._stop.set()
        self._thread.join(5)
        self.poll(psutil.Process())  # a last look
        return self.found


_trained: list[str] = []


def _record_training() -> None:
    try:
        import fixture_model.build as build
    except ImportError:  # pragma: no cover
        return
    if getattr(build.train, "_fuzzserve_recorded", False):
        return
    original = build.train

    def train(*args, **kwargs):
        _trained.append("fixture_model.build.train")
        return original(*args, **kwargs)

    vars(train)["_fuzzserve_recorded"] = True  # a mark on the wrapper (the function's own namespace)
    build.train = train


def pytest_configure(config):
    config.addinivalue_line("markers", "engine: starts a real vLLM engine or trains the fixture model")
    config.addinivalue_line("markers", "serve: starts a real Ray cluster")
    _record_training()


def _markers(item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in ("engine", "serve")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Before ``-m`` deselects anything: note each test whose fixtures need a marker it lacks."""
    for item in items:
        need = set().union(*(FIXTURE_MARKERS.get(f, set()) for f in getattr(item, "fixturenames", ())))
        missing = need - _markers(item)
        if missing:
            uses = sorted(f for f in item.fixturenames if FIXTURE_MARKERS.get(f, set()) & missing)
            setattr(item, _PROBLEM, f"uses {', '.join(uses)} but is not marked {', '.join(sorted(missing))}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    problem = getattr(item, _PROBLEM, None)
    if problem:
        pytest.fail(f"marker check: {item.nodeid} {problem} (tests/markers.py)", pytrace=False)
    wanted = {"engine", "serve"} - _markers(item)
    if _must_start_an_engine(item):
        wanted.add("engine")
    if wanted:
        setattr(item, _WATCH, (Watcher(wanted), len(_trained)))
    yield


def _must_start_an_engine(item) -> bool:
    """Marked engine (not serve: a cluster's engines are its business), with no engine fixture: it must start one."""
    markers = _markers(item)
    uses = set().union(*(FIXTURE_MARKERS.get(f, set()) for f in getattr(item, "fixturenames", ())))
    return markers == {"engine"} and "engine" not in uses


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    watch = getattr(item, _WATCH, None)
    if watch is None:
        return
    delattr(item, _WATCH)
    watcher, trained_before = watch
    found = watcher.stop()
    if "engine" in watcher.wanted and len(_trained) > trained_before:
        found.setdefault("engine", "trained the fixture model (fixture_model.build.train)")
    problems = [
        f"started {what} without the {marker!r} marker"
        for marker, what in sorted(found.items())
        if marker not in _markers(item)
    ]
    if _must_start_an_engine(item) and "engine" not in found:
        problems.append(
            "is marked engine but started no engine and trained nothing: a pure test belongs in the fast suite"
        )
    if problems:
        item._fuzzserve_marker_violation = "; ".join(problems)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    violation = getattr(item, "_fuzzserve_marker_violation", None)
    if call.when == "teardown" and violation:
        report.outcome = "failed"
        report.longrepr = f"marker check: {item.nodeid} {violation} (tests/markers.py)"
