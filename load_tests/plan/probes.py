"""Greedy probes: do faults change what the model answers? Compared through Serve, not offline (the probe set;
:mod:`load_tests.judge.probes` compares the answers).

A fixed set of greedy (temperature 0) completions, on the run's shared
long prefixes (so their KV goes through the prefix cache and the offload
tier, where loads fail and the connector lies) and on short prompts, some
with a seeded gaussian fuzz. The soak sends the set every ``every_s``
seconds *during* the chaos load, and once (twice, to check the reference
itself is stable) to a fault-free deployment of the same config. Every
probe answered under faults must equal the fault-free answer; a probe that
failed is not compared (the verdict already judges failed requests:
explained by the replica kill or not).
"""

from __future__ import annotations

from typing import Any

from fixture_model.tasks import held_out_examples

from .workload import Mix, RequestSpec, shared_prefixes

MAX_TOKENS = 16
PROBE_INDEX_BASE = 1_000_000  # probe i of round k has index 1e6 (k + 1) + i: never a load request's index


def probe_bodies(mix: Mix | None = None, n: int = 12) -> list[dict[str, Any]]:
    """Greedy completion bodies, ``n`` held-out examples of each fixture task (36 with the default): half on the
    shared prefixes, a third fuzzed (gaussian, fixed seed)."""
    mix = mix or Mix()
    prefixes = shared_prefixes(mix.n_prefixes, mix.prefix_tokens)
    tails = held_out_examples(n, seed=9090)
    bodies = []
    for i, tail in enumerate(tails):
        prompt = f"{prefixes[i % len(prefixes)]} {tail.prompt}" if i % 2 == 0 else tail.prompt
        body: dict[str, Any] = {"model": mix.model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
        if i % 3 == 1:
            body["vllm_xargs"] = {"fuzz_strength": 0.5, "fuzz_mode": "gaussian", "fuzz_seed": i}
        bodies.append(body)
    return bodies


def probe_specs(round_no: int, mix: Mix | None = None, n: int = 12) -> list[RequestSpec]:
    """The probe set as request specs of round ``round_no`` (sent with the load's own client, so each probe is
    a request like any other in the verdict and the client/server cross-check)."""
    return [
        RequestSpec(
            PROBE_INDEX_BASE * (round_no + 1) + i,
            "/v1/completions",
            body,
            tags={"kind": "probe", "probe": i, "round": round_no, "keep_text": True},
        )
        for i, body in enumerate(probe_bodies(mix, n))
    ]
