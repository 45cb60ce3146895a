"""What a server says it served from cache during one benchmark run (prefix-cache and offload-tier hits), and
where its requests' time to first token went (its own latency histograms).

Why: a benchmark meant to be cold must show it was (a cache hit there means
the workload repeated itself and the figures flatter whichever stack has the
bigger cache), and a reuse benchmark must say how many prompt tokens each
tier served. The server's own counters are the authority, read the same way
from every stack: a vLLM OpenAI server's ``/metrics`` (``vllm:...``) or Ray's
metrics agents under Serve (``ray_vllm_...``, one series per replica, summed
here). :func:`load_tests.observe.counters.canonical` maps both to vLLM's names.

Under Serve a replica's counters reach its node's agent every few seconds,
so a run's counters are read once the server has counted every request the
client completed (:func:`wait_for_requests`): ``vllm:request_success`` (all
finish reasons) grown by at least that many since the reading before the run.

The latency histograms split a request's time to first token the way vLLM
times it (means over a run, from each histogram's ``_sum`` / ``_count``):
``queue`` (EngineCore: queued until first scheduled) and ``prefill``
(scheduled until its first token) are the engine's; ``server_ttft`` is the
frontend's (the request's arrival at vLLM's ``AsyncLLM`` until the frontend
has its first token), so ``server_ttft - queue - prefill`` is the hand-offs
between frontend and EngineCore, and the client's TTFT minus
``server_ttft`` is everything before ``AsyncLLM`` and after it (HTTP,
parsing, the guard, HAProxy and Ray's streaming on the shipped stack).
Only a vLLM server's own histograms are read: Ray 2.60's metrics agent
re-observes each replica's histogram buckets at their midpoints
(``ray/_private/telemetry/open_telemetry_metric_recorder.py``), so under
Serve a ``_sum`` is bucket midpoint x count (every queue time under 0.3 s
reads 0.15 s, seen 2026-11-27): no mean finer than the buckets. The shipped
arm's split is its client TTFT against the engine arm's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import TypedDict

import httpx

from load_tests.observe.counters import canonical
from load_tests.observe.prom_text import parse_samples

# field -> vLLM's counter name (without _total)
COUNTERS = {
    "requests": "vllm:request_success",
    "prompt_tokens": "vllm:prompt_tokens",
    "prefix_cache_queries": "vllm:prefix_cache_queries",
    "prefix_cache_hits": "vllm:prefix_cache_hits",
    "external_queries": "vllm:external_prefix_cache_queries",
    "external_hits": "vllm:external_prefix_cache_hits",
}
BY_SOURCE = "vllm:prompt_tokens_by_source"  # label source: local_compute / local_cache_hit / external_kv_transfer
# part of a request's time to first token -> vLLM's histogram (seconds) that times it
LATENCY_HISTOGRAMS = {
    "server_ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}


class CountersJson(TypedDict, total=False):
    """:meth:`CacheCounters.to_json`: every field, then the derived figures (a run whose counters were not read
    has none of them)."""

    requests: float
    prompt_tokens: float
    prefix_cache_queries: float
    prefix_cache_hits: float
    external_queries: float
    external_hits: float
    by_source: dict[str, float]
    latency_sum: dict[str, float]
    latency_count: dict[str, float]
    hit_tokens: float
    offload_hit_tokens_per_request: float | None
    latency_mean_ms: dict[str, float | None]


@dataclass
class CacheCounters:
    """Sums over every engine the endpoints report (tokens, except ``requests``). Absent counters read 0.

    A new field goes into :class:`CountersJson` and :meth:`to_json` too."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0  # the local prefix cache's hits, in tokens
    external_queries: float = 0.0
    external_hits: float = 0.0  # the KV connector's (offload tier's) hits, in tokens
    by_source: dict[str, float] = field(default_factory=dict)  # prompt tokens by where they came from
    latency_sum: dict[str, float] = field(default_factory=dict)  # LATENCY_HISTOGRAMS part -> _sum (seconds)
    latency_count: dict[str, float] = field(default_factory=dict)  # LATENCY_HISTOGRAMS part -> _count

    def __sub__(self, other: CacheCounters) -> CacheCounters:
        keyed = ("by_source", "latency_sum", "latency_count")
        out = CacheCounters(
            **{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self) if f.name not in keyed}
        )
        for name in keyed:
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(out, name, {k: mine.get(k, 0.0) - theirs.get(k, 0.0) for k in sorted(set(mine) | set(theirs))})
        return out

    def latency_mean_ms(self) -> dict[str, float | None]:
        """Per part of the time to first token (:data:`LATENCY_HISTOGRAMS`): its mean over the requests timed."""
        return {
            part: (
                1000 * self.latency_sum.get(part, 0.0) / self.latency_count[part]
                if self.latency_count.get(part)
                else None
            )
            for part in LATENCY_HISTOGRAMS
        }

    @property
    def hit_tokens(self) -> float:
        """Prompt tokens either tier served."""
        return self.prefix_cache_hits + self.external_hits

    def to_json(self) -> CountersJson:
        """Every field in order (as ``dataclasses.asdict``), then ``hit_tokens``, ``offload_hit_tokens_per_request``
        and ``latency_mean_ms``."""
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "prefix_cache_queries": self.prefix_cache_queries,
            "prefix_cache_hits": self.prefix_cache_hits,
            "external_queries": self.external_queries,
            "external_hits": self.external_hits,
            "by_source": dict(self.by_source),
            "latency_sum": dict(self.latency_sum),
            "latency_count": dict(self.latency_count),
            "hit_tokens": self.hit_tokens,
            "offload_hit_tokens_per_request": self.external_hits / self.requests if self.requests else None,
            "latency_mean_ms": self.latency_mean_ms(),
        }


def parse_counters(texts: Sequence[str]) -> CacheCounters:
    """:class:`CacheCounters` from Prometheus text expositions (one per endpoint), every series summed."""
    want = {name: f for f, name in COUNTERS.items()}
    histograms = {
        name + suffix: (part, target)
        for part, name in LATENCY_HISTOGRAMS.items()
        for suffix, target in (("_sum", "latency_sum"), ("_count", "latency_count"))
    }
    out = CacheCounters()
    for text in texts:
        for (sample, labels), value in parse_samples(text).items():
            c = canonical(sample)
            if c is not None and c[0] in histograms:
                # Ray re-observes each bucket at its midpoint: no mean finer than the buckets (see above)
                if not sample.startswith("ray_vllm_"):
                    part, target = histograms[c[0]]
                    slot = getattr(out, target)
                    slot[part] = slot.get(part, 0.0) + value
                continue
            if c is None or not c[1]:  # only counters' _total samples
                continue
            name = c[0]
            if name in want:
                setattr(out, want[name], getattr(out, want[name]) + value)
            elif name == BY_SOURCE:
                source = dict(labels).get("source", "")
                out.by_source[source] = out.by_source.get(source, 0.0) + value
    return out


# What reading a metrics endpoint can raise: the request failed or got an error status (httpx.HTTPError), or its
# text is not the exposition format (ValueError). A reader that treats an unreadable endpoint as "unknown" catches
# these and nothing broader.
READ_ERRORS: tuple[type[Exception], ...] = (httpx.HTTPError, ValueError)


def read_counters(urls: Sequence[str], get: Callable[[str], str] | None = None) -> CacheCounters:
    """The counters at ``urls`` now (every URL must answer)."""
    get = get or (lambda u: httpx.get(u, timeout=10).raise_for_status().text)
    return parse_counters([get(u) for u in urls])


def wait_for_requests(
    urls: Sequence[str],
    before: CacheCounters,
    requests: int,
    timeout_s: float = 90.0,
    interval_s: float = 1.0,
    get: Callable[[str], str] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CacheCounters:
    """The counters once the server has counted at least ``requests`` more finished requests than ``before``;
    raises TimeoutError (naming what it saw) if that takes longer than ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        now = read_counters(urls, get)
        if now.requests - before.requests >= requests:
            return now
        if clock() > deadline:
            raise TimeoutError(
                f"the server counted {now.requests - before.requests:.0f} finished requests in "
                f"{timeout_s:.0f} s, the client completed {requests} ({', '.join(urls)})"
            )
        sleep(interval_s)
