"""Greedy probes: do faults change what the model answers? Compared through Serve, not offline.

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

from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fixture_model.tasks import held_out_examples

from .client import RequestResult
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
    return [RequestSpec(PROBE_INDEX_BASE * (round_no + 1) + i, "/v1/completions", body,
                        tags={"kind": "probe", "probe": i, "round": round_no, "keep_text": True})
            for i, body in enumerate(probe_bodies(mix, n))]


@dataclass
class ProbeAnswer:
    round: int
    index: int  # which probe
    t: float  # seconds since the run started
    text: str | None  # None: the request failed (its outcome says how)

    @classmethod
    def of(cls, r: RequestResult) -> ProbeAnswer:
        return cls(r.spec["tags"]["round"], r.spec["tags"]["probe"], r.start, r.text if r.outcome == "ok" else None)


def answers(results: list[RequestResult]) -> list[ProbeAnswer]:
    return [ProbeAnswer.of(r) for r in results if r.spec.get("tags", {}).get("kind") == "probe"]


class ProbeVerdict(BaseModel):
    """The greedy probes of a run against the fault-free deployment (``RunSummary.probes``)."""

    model_config = ConfigDict(extra="forbid")

    rounds: int
    sent: int
    compared: int
    equal: int
    failed: int = Field(description="probes that failed (judged with the other requests, not compared)")
    differing: list[dict[str, Any]] = Field(description="the first 10 answers that differ, with the reference's")
    problems: list[str]
    reference: list[ProbeAnswer] = Field(default_factory=list, description="the fault-free answers")


def compare(reference: list[ProbeAnswer], under_faults: list[ProbeAnswer]) -> ProbeVerdict:
    """Every answered probe under faults against the fault-free answer of the same probe."""
    ref = {a.index: a.text for a in reference if a.text is not None}
    differing = [asdict(a) | {"reference": ref[a.index]} for a in under_faults
                 if a.text is not None and a.index in ref and a.text != ref[a.index]]
    compared = sum(a.text is not None and a.index in ref for a in under_faults)
    problems = []
    if len(ref) < len({a.index for a in reference}):
        problems.append(f"the fault-free reference failed {len({a.index for a in reference}) - len(ref)} probe(s)")
    if differing:
        problems.append(f"{len(differing)} of {compared} greedy probe answers under faults differ from the "
                        f"fault-free run (first: probe {differing[0]['index']} at t = {differing[0]['t']:.0f} s)")
    if not compared:
        problems.append("no probe was answered under faults: nothing compared")
    return ProbeVerdict(rounds=len({a.round for a in under_faults}), sent=len(under_faults), compared=compared,
                        equal=compared - len(differing), failed=sum(a.text is None for a in under_faults),
                        differing=differing[:10], problems=problems)


def reference_is_stable(first: list[ProbeAnswer], second: list[ProbeAnswer]) -> list[str]:
    """Greedy answers of one fault-free deployment to the same probes twice must agree (else nothing can be compared)."""
    a = {p.index: p.text for p in first}
    return [f"fault-free probe {p.index} answered differently twice: {a.get(p.index)!r} vs {p.text!r}"
            for p in second if p.text != a.get(p.index)]
