"""Read counters out of a Prometheus text exposition (prometheus_client's parser).

Shared by the tests, the load-test monitor and the benchmarks: one way to turn a
scrape into ``{(sample name, labels): value}``.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families

Labels = tuple[tuple[str, str], ...]


def parse_samples(text: str) -> dict[tuple[str, Labels], float]:
    """Every sample of every family, keyed by (sample name, sorted labels)."""
    out: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict[tuple[str, Labels], float], name: str, **match: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``match``."""
    return sum(
        v
        for (n, labels), v in samples.items()
        if n == name and all(dict(labels).get(k) == want for k, want in match.items())
    )


def series(samples: dict[tuple[str, Labels], float], name: str) -> Iterable[tuple[dict[str, str], float]]:
    for (n, labels), v in samples.items():
        if n == name:
            yield dict(labels), v
