"""Benchmark: time to first token on a long prefix reloaded from the KV offload tier vs recomputed.

    python -m benchmarks.investigations.offload_ttft [--repeats 5] [--prefix-examples 70] [--json out/offload_ttft.json]

One engine with offloading on and a KV pool too small to keep the prefixes:
each round requests prefix A (computed, stored to the offload tier), then
enough other prefixes to evict A from the engine pool, then A again. The last
request's prefill is a reload from the host pool (checked on the external
token counter), and its TTFT is compared with the same request on an engine
without offloading (recomputed). TTFT = latency of a 1-token generation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from serve_app.engine.engine_env import use_engine_env


def _prefixes(n: int, examples_each: int) -> list[str]:
    from fixture_model.tasks import training_examples

    ex = training_examples(n * examples_each, seed=11)
    return [" ".join(e.text for e in ex[i * examples_each : (i + 1) * examples_each]) for i in range(n)]


def _external_tokens(llm) -> float:
    return sum(
        m.value
        for m in llm.get_metrics()
        if m.name == "vllm:prompt_tokens_by_source" and m.labels.get("source") == "external_kv_transfer"
    )


def measure(offload: bool, repeats: int, examples_each: int, model: str) -> dict:
    from vllm import LLM, SamplingParams

    offload_kwargs: dict[str, Any] = {"kv_offloading_size": 0.25, "kv_offloading_backend": "native"} if offload else {}
    llm = LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        enable_prefix_caching=True,
        num_gpu_blocks_override=12,
        disable_log_stats=False,
        seed=0,
        **offload_kwargs,
    )
    one = SamplingParams(temperature=0, max_tokens=1)
    prefixes = _prefixes(4 * repeats, examples_each)
    ttfts, reloaded = [], []
    for r in range(repeats):
        target, *evictors = prefixes[4 * r : 4 * r + 4]
        prompt = target + " count 3 4 5"
        llm.generate([prompt], one, use_tqdm=False)  # compute (and store to the tier)
        for e in evictors:  # push it out of the 12-block engine pool
            llm.generate([e + " abc d e f"], one, use_tqdm=False)
        before = _external_tokens(llm)
        t0 = time.perf_counter()
        out = llm.generate([prompt], one, use_tqdm=False)
        ttfts.append(time.perf_counter() - t0)
        reloaded.append(_external_tokens(llm) - before)
    prompt_ids = out[0].prompt_token_ids
    if prompt_ids is None:
        raise RuntimeError("vLLM returned no prompt token ids")
    n_tokens = len(prompt_ids)
    del llm
    return {
        "offload": offload,
        "prompt_tokens": n_tokens,
        "ttft_s": ttfts,
        "reloaded_tokens": reloaded,
        "ttft_median_s": statistics.median(ttfts),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prefix-examples", type=int, default=70, help="examples per prefix (~13 tokens each)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    use_engine_env()
    from fixture_model.build import ensure_model

    model = str(ensure_model())
    results = [
        measure(False, args.repeats, args.prefix_examples, model),
        measure(True, args.repeats, args.prefix_examples, model),
    ]
    from rich.console import Console
    from rich.table import Table

    table = Table(title="TTFT of a long prefix: recomputed vs reloaded from the offload tier")
    for col in ("engine", "prompt tokens", "tokens reloaded / run", "TTFT median", "TTFT runs"):
        table.add_column(col)
    for r in results:
        table.add_row(
            "offloading on (reload)" if r["offload"] else "offloading off (recompute)",
            str(r["prompt_tokens"]),
            str(r["reloaded_tokens"]),
            f"{r['ttft_median_s'] * 1000:.1f} ms",
            ", ".join(f"{t * 1000:.0f}" for t in r["ttft_s"]),
        )
    Console().print(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
