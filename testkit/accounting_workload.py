"""The workload and the checks shared by the accounting/offloading engine tests.

Long shared prefixes (several 128-token blocks) so that the prefix cache and
the offload tier are used; a KV pool small enough that they are evicted and
reloaded and that running requests preempt each other.
"""

from __future__ import annotations

from typing import Any

from fixture_model.tasks import held_out_examples, training_examples
from patches.definitions.fault_config import offloading_connector_config

N_PREFIXES = 6
PREFIX_EXAMPLES = 40  # ~500 tokens: four full blocks
MAX_TOKENS = 8


def prompts(n_requests: int = 48) -> list[str]:
    ex = training_examples(N_PREFIXES * PREFIX_EXAMPLES, seed=5)
    prefixes = [
        " ".join(e.text for e in ex[i * PREFIX_EXAMPLES : (i + 1) * PREFIX_EXAMPLES]) for i in range(N_PREFIXES)
    ]
    tails = held_out_examples(n_requests // 3 + 1)
    return [f"{prefixes[i % N_PREFIXES]} {tails[i].prompt}" for i in range(n_requests)]


def offload_engine_kwargs(faults: dict[str, Any] | None = None, blocks: int = 24) -> dict[str, Any]:
    return dict(
        enforce_eager=True,
        num_gpu_blocks_override=blocks,
        max_num_seqs=16,
        kv_transfer_config=offloading_connector_config(256 << 20, faults),
    )


class EngineMetrics(dict):
    """``{name{source/kind}: value}`` for the tests' asserts, and ``samples``: the same counters and gauges as
    ``(name, is_counter, labels, value)``, which ``load_tests.observe.counters`` reads like any scrape."""

    samples: list[tuple[str, bool, dict[str, str], float]]


def metrics(llm) -> EngineMetrics:
    """The prompt-token and accounting counters of an offline LLM, summed per (name, source/kind)."""
    from vllm.v1.metrics.reader import Counter, Gauge

    out = EngineMetrics()
    out.samples = [
        (m.name, isinstance(m, Counter), dict(m.labels), float(m.value))
        for m in llm.get_metrics()
        if isinstance(m, (Counter, Gauge))
    ]
    for m in llm.get_metrics():
        if not (m.name.startswith("vllm:prompt_token") or "prefix_cache" in m.name or m.name == "vllm:num_preemptions"):
            continue
        label = m.labels.get("source") or m.labels.get("kind")
        key = f"{m.name}{{{label}}}" if label else m.name
        out[key] = out.get(key, 0) + (getattr(m, "value", 0) or 0)
    return out


def check_invariants(m: EngineMetrics) -> list[str]:
    """Violated invariants of an idle engine's metrics (empty when all hold): the load test's own rules
    (load_tests.observe.invariants), on the engine's counters read the way a scrape is read."""
    from load_tests.observe.counters import counters_from_samples
    from load_tests.observe.invariants import at_rest

    [engine] = counters_from_samples(m.samples).values()
    return [f.message for f in at_rest(engine)]


def run_with_aborts(llm, prompt_list: list[str], abort_every: int = 3, abort_after_tokens: int = 2) -> dict[str, Any]:
    """Drive the engine step by step and abort every ``abort_every``-th request mid-generation.

    Runs in the engine host (``EngineHost.eval``). Returns the finished
    requests' token ids by index and the indexes that were aborted.
    """
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    ids = [f"abort-test-{i}" for i in range(len(prompt_list))]
    for rid, p in zip(ids, prompt_list, strict=False):
        engine.add_request(rid, p, params)
    to_abort = {ids[i] for i in range(0, len(ids), abort_every)}
    finished: dict[str, list[int]] = {}
    aborted: set[str] = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            rid = out.request_id
            if out.finished:
                finished[rid] = list(out.outputs[0].token_ids)
            elif rid in to_abort and rid not in aborted and len(out.outputs[0].token_ids) >= abort_after_tokens:
                engine.abort_request([rid])
                aborted.add(rid)
    return {
        "finished": {ids.index(r): t for r, t in finished.items() if r not in aborted},
        "aborted": sorted(ids.index(r) for r in aborted),
    }
