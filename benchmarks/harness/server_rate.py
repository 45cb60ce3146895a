"""The server's own throughput during a client's run, from its counters, to set each client's figure against.

Two clients that drive the same server read different requests/s when they
divide by different windows: each counts from its own first send to its own
last answer, so its ramp-up and tail, a large share of a 5-second run, are in
its figure. The server's own rate does not depend on them. While a run goes,
:class:`RateSampler` reads the finished-requests counter
(``vllm:request_success``, every engine the endpoints report) every
``interval_s``; :func:`steady_rate` takes the rate over the run's middle (the
samples between the first tenth and the last tenth of the requests it
counted), where the load is what the client set. Under Serve the counters move
only when Ray's metrics agent exports (every few seconds), so a rate needs a
run of several export periods (30 s or more) and is read between the first and
last *change* inside that middle, never across an idle stretch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from benchmarks.harness.server_counters import READ_ERRORS
from serve_app.observability.contract import RAY_VLLM_PREFIX, REQUEST_SUCCESS

log = logging.getLogger("fuzzserve.benchmarks.server_rate")

EDGE_SHARE = 0.1  # the share of the run's requests at each end left out of the steady rate
# What one sample of the count can raise: the endpoint unreadable (READ_ERRORS) or a sample line without a value.
SAMPLE_ERRORS: tuple[type[Exception], ...] = (*READ_ERRORS, IndexError)


@dataclass
class RateSampler:
    """Reads the server's finished-requests count every ``interval_s`` in a thread (``with`` it around a run);
    ``samples``: (monotonic time, count)."""

    urls: Sequence[str]
    interval_s: float = 0.5
    read: Callable[[Sequence[str]], float] | None = None
    samples: list[tuple[float, float]] = field(default_factory=list)
    cpu_s: float = 0.0  # the sampler thread's own CPU: a client measured in this process is not charged for it

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="server-rate", daemon=True)

    def _count(self) -> float:
        return self.read(self.urls) if self.read is not None else finished_requests(self.urls)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.thread_time()
            try:
                self.samples.append((time.monotonic(), self._count()))
            except SAMPLE_ERRORS as e:  # a missed sample: the rate is read from the others
                log.debug("server counters unreadable: %s", e)
            self.cpu_s += time.thread_time() - t
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RateSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


# The finished-requests counter's sample names: a plain vLLM server's, and Ray's re-export of a replica's.
SUCCESS_SAMPLES = (f"{REQUEST_SUCCESS}_total", RAY_VLLM_PREFIX + REQUEST_SUCCESS.removeprefix("vllm:") + "_total")


def finished_requests(urls: Sequence[str], get: Callable[[str], str] | None = None) -> float:
    """The finished-requests count summed over every series of every endpoint, read by scanning the text for its
    lines only: Ray's metrics page runs to thousands of series, and parsing it whole every second (0.35 s of CPU
    a read here) would take the clients' CPU and their process's GIL in the middle of the run it times."""
    get = get or (lambda url: httpx.get(url, timeout=10).text)
    total = 0.0
    for url in urls:
        for line in get(url).splitlines():
            if line.startswith(SUCCESS_SAMPLES) and line.split("{", 1)[0].split(" ", 1)[0] in SUCCESS_SAMPLES:
                rest = line.rsplit("}", 1)[-1].split() if "}" in line else line.split()[1:]
                total += float(rest[0])
    return total


def steady_rate(samples: Sequence[tuple[float, float]], edge_share: float = EDGE_SHARE) -> dict[str, float] | None:
    """The server's requests per second over the middle of a run: from the first sample whose count is past the
    first ``edge_share`` of the run's requests to the last sample before the last ``edge_share``, each taken where
    the count changed (an export), so the span runs between two exports. None when fewer than two changes fall in
    the middle (too short a run for the export period)."""
    if len(samples) < 2:
        return None
    base, total = samples[0][1], samples[-1][1] - samples[0][1]
    if total <= 0:
        return None
    lo, hi = base + edge_share * total, base + (1 - edge_share) * total
    changes = [(t, c) for (t, c), (_, prev) in zip(samples[1:], samples[:-1], strict=False) if c != prev]
    middle = [(t, c) for t, c in changes if lo <= c <= hi]
    if len(middle) < 2 or middle[-1][0] <= middle[0][0]:
        return None
    (t0, c0), (t1, c1) = middle[0], middle[-1]
    return {
        "requests_per_s": (c1 - c0) / (t1 - t0),
        "span_s": t1 - t0,
        "requests": c1 - c0,
        "changes": float(len(middle)),
    }
