"""The greedy probes' judgement: every probe answered under faults against the fault-free answer of the same probe
(the probe set is :mod:`load_tests.plan.probes`; the soak sends it during the chaos load and, twice, to a
fault-free deployment of the same config).

A probe that failed is not compared: the verdict already judges failed
requests (explained by the replica kill or not).
"""

from __future__ import annotations

from dataclasses import asdict

from ..load.client import RequestResult
from ..results.models import ProbeAnswer, ProbeReference, ProbeVerdict


def answers(results: list[RequestResult]) -> list[ProbeAnswer]:
    """The probes among ``results``, each as its answer (text None: the request failed)."""
    return [
        ProbeAnswer(r.spec["tags"]["round"], r.spec["tags"]["probe"], r.start, r.text if r.outcome == "ok" else None)
        for r in results
        if r.spec.get("tags", {}).get("kind") == "probe"
    ]


def reference_is_stable(first: list[ProbeAnswer], second: list[ProbeAnswer]) -> list[str]:
    """Greedy answers of one fault-free deployment to the same probes twice must agree (else nothing can be
    compared)."""
    a = {p.index: p.text for p in first}
    return [
        f"fault-free probe {p.index} answered differently twice: {a.get(p.index)!r} vs {p.text!r}"
        for p in second
        if p.text != a.get(p.index)
    ]


def reference(first: list[RequestResult], second: list[RequestResult]) -> ProbeReference:
    """The fault-free deployment's two rounds of probes: the first round's answers, and whether the second agreed."""
    answered = answers(first)
    return ProbeReference(answers=answered, problems=reference_is_stable(answered, answers(second)))


def compare(reference: list[ProbeAnswer], under_faults: list[ProbeAnswer]) -> ProbeVerdict:
    """Every answered probe under faults against the fault-free answer of the same probe."""
    ref = {a.index: a.text for a in reference if a.text is not None}
    differing = [
        asdict(a) | {"reference": ref[a.index]}
        for a in under_faults
        if a.text is not None and a.index in ref and a.text != ref[a.index]
    ]
    compared = sum(a.text is not None and a.index in ref for a in under_faults)
    problems = []
    if len(ref) < len({a.index for a in reference}):
        problems.append(f"the fault-free reference failed {len({a.index for a in reference}) - len(ref)} probe(s)")
    if differing:
        problems.append(
            f"{len(differing)} of {compared} greedy probe answers under faults differ from the "
            f"fault-free run (first: probe {differing[0]['index']} at t = {differing[0]['t']:.0f} s)"
        )
    if not compared:
        problems.append("no probe was answered under faults: nothing compared")
    return ProbeVerdict(
        rounds=len({a.round for a in under_faults}),
        sent=len(under_faults),
        compared=compared,
        equal=compared - len(differing),
        failed=sum(a.text is None for a in under_faults),
        differing=differing[:10],
        problems=problems,
    )


def probe_verdict(ref: ProbeReference, results: list[RequestResult]) -> ProbeVerdict:
    """The run's probes against the reference, the reference's own problems first (``RunSummary.probes``)."""
    verdict = compare(ref.answers, answers(results))
    verdict.problems = ref.problems + verdict.problems
    verdict.reference = ref.answers
    return verdict
