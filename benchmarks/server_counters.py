"""What a server says it served from cache during one benchmark run: prefix-cache and offload-tier hits.

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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields

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


@dataclass
class CacheCounters:
    """Sums over every engine the endpoints report (tokens, except ``requests``). Absent counters read 0."""

    requests: float = 0.0
    prompt_tokens: float = 0.0
    prefix_cache_queries: float = 0.0
    prefix_cache_hits: float = 0.0  # the local prefix cache's hits, in tokens
    external_queries: float = 0.0
    external_hits: float = 0.0  # the KV connector's (offload tier's) hits, in tokens
    by_source: dict[str, float] = field(default_factory=dict)  # prompt tokens by where they came from

    def __sub__(self, other: CacheCounters) -> CacheCounters:
        out = CacheCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name)
                               for f in fields(self) if f.name != "by_source"})
        out.by_source = {k: self.by_source.get(k, 0.0) - other.by_source.get(k, 0.0)
                         for k in sorted(set(self.by_source) | set(other.by_source))}
        return out

    @property
    def hit_tokens(self) -> float:
        """Prompt tokens either tier served."""
        return self.prefix_cache_hits + self.external_hits

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["hit_tokens"] = self.hit_tokens
        d["offload_hit_tokens_per_request"] = self.external_hits / self.requests if self.requests else None
        return d


def parse_counters(texts: Sequence[str]) -> CacheCounters:
    """:class:`CacheCounters` from Prometheus text expositions (one per endpoint), every series summed."""
    want = {name: f for f, name in COUNTERS.items()}
    out = CacheCounters()
    for text in texts:
        for (sample, labels), value in parse_samples(text).items():
            c = canonical(sample)
            if c is None or not c[1]:  # only counters' _total samples
                continue
            name = c[0]
            if name in want:
                setattr(out, want[name], getattr(out, want[name]) + value)
            elif name == BY_SOURCE:
                source = dict(labels).get("source", "")
                out.by_source[source] = out.by_source.get(source, 0.0) + value
    return out


def read_counters(urls: Sequence[str], get: Callable[[str], str] | None = None) -> CacheCounters:
    """The counters at ``urls`` now (every URL must answer)."""
    get = get or (lambda u: httpx.get(u, timeout=10).raise_for_status().text)
    return parse_counters([get(u) for u in urls])


def wait_for_requests(urls: Sequence[str], before: CacheCounters, requests: int, timeout_s: float = 90.0,
                      interval_s: float = 1.0, get: Callable[[str], str] | None = None,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      ) -> CacheCounters:
    """The counters once the server has counted at least ``requests`` more finished requests than ``before``;
    raises TimeoutError (naming what it saw) if that takes longer than ``timeout_s``."""
    deadline = clock() + timeout_s
    while True:
        now = read_counters(urls, get)
        if now.requests - before.requests >= requests:
            return now
        if clock() > deadline:
            raise TimeoutError(f"the server counted {now.requests - before.requests:.0f} finished requests in "
                               f"{timeout_s:.0f} s, the client completed {requests} ({', '.join(urls)})")
        sleep(interval_s)

