"""Fuzz sweep: fixture-task accuracy and output divergence against fuzz strength, per mode and depth.

    python -m load_tests.load.fuzz_sweep [--model DIR] [--per-task N] [--layers 0,1,-1] [--compile] [--json OUT]

Runs a patched vLLM engine (offline ``LLM`` API) on the fixture model's
held-out prompts at every strength of each mode's sweep, at every depth
(``fuzz_layer``: 0 the input embeddings, 1 after the first decoder layer, -1
after the last), greedy decoding, and reports per (mode, depth, strength):
task accuracy, and divergence from the unfuzzed (s = 0) output (share of
prompts whose output differs, and mean share of differing tokens). The same
functions are used by the tests and by the load-test report (a table and a
layer x strength heatmap).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from load_tests.command_logs import command_logging
from serve_app.engine.engine_env import use_engine_env

from ..plan.workload import LOG_SWEEP

# The gaussian sweep runs over the load's fuzz levels (LOG_SWEEP). Scale mode
# zeroes the embeddings for every s >= 1, so its sweep lives below 1, dense near
# 1: Llama normalises each layer's input (RMSNorm), so scaling every embedding by
# a factor changes less than one might expect (on a random 2-layer Llama, 0.5 or
# 0.1 left the first greedy tokens of some prompts unchanged), and the effect
# grows mostly near s = 1.
SWEEPS: dict[str, list[float]] = {
    "scale": [0.0, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0],
    "gaussian": [0.0, 0.1, 0.3, *LOG_SWEEP[1:]],
}
MAX_TOKENS = 8
# The depths swept by default: valid on any model with a decoder layer (0: the input embeddings, 1: after the first
# layer, -1: after the last); on the 2-layer fixture model, every point there is.
LAYERS: tuple[int, ...] = (0, 1, -1)


@dataclass
class SweepPoint:
    mode: str
    strength: float
    accuracy: float
    accuracy_by_task: dict[str, float]
    changed_outputs: float  # share of prompts whose output differs from s = 0
    token_divergence: float  # mean share of output tokens that differ from s = 0
    layer: int = 0  # fuzz_layer: 0 the input embeddings, k after decoder layer k, negative from the end


def fuzz_xargs(mode: str, strength: float, seed: int = 0, layer: int = 0) -> dict[str, Any]:
    xargs: dict[str, Any] = {"fuzz_strength": strength, "fuzz_mode": mode, "fuzz_seed": seed}
    if layer:
        xargs["fuzz_layer"] = layer
    return xargs


def parse_layers(text: str) -> tuple[int, ...]:
    """``"0,1,-1"`` -> (0, 1, -1): the depths of a sweep, in order, each once."""
    try:
        layers = tuple(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"layers {text!r}: comma-separated integers (fuzz_layer values), e.g. 0,1,-1") from None
    if not layers:
        raise ValueError("layers: at least one fuzz_layer value")
    return layers


def token_divergence(a: list[int], b: list[int]) -> float:
    """Share of positions (over the longer output) where two token lists differ."""
    n = max(len(a), len(b))
    if n == 0:
        return 0.0
    same = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    return 1.0 - same / n


def summarize(mode: str, strength: float, examples, outputs, baseline, layer: int = 0) -> SweepPoint:
    """Score one strength: ``outputs``/``baseline`` are (text, token_ids) per example."""
    from fixture_model.tasks import is_correct

    by_task: dict[str, list[bool]] = {}
    for ex, (text, _ids) in zip(examples, outputs, strict=False):
        by_task.setdefault(ex.task, []).append(is_correct(ex, text))
    flat = [ok for v in by_task.values() for ok in v]
    div = [token_divergence(o[1], b[1]) for o, b in zip(outputs, baseline, strict=False)]
    return SweepPoint(
        mode=mode,
        strength=strength,
        accuracy=sum(flat) / len(flat),
        accuracy_by_task={t: sum(v) / len(v) for t, v in by_task.items()},
        changed_outputs=sum(d > 0 for d in div) / len(div),
        token_divergence=float(np.mean(div)),
        layer=layer,
    )


def run_sweep(
    generate, examples, sweeps: dict[str, list[float]] = SWEEPS, layers: tuple[int, ...] = (0,)
) -> list[SweepPoint]:
    """``generate(prompts, xargs) -> [(text, token_ids)]`` runs one greedy batch; every strength of each mode
    at every depth of ``layers`` (s = 0 is the unfuzzed baseline, run once)."""
    prompts = [ex.prompt for ex in examples]
    baseline = generate(prompts, None)
    points = []
    for layer in layers:
        for mode, strengths in sweeps.items():
            for s in strengths:
                outputs = baseline if s == 0 else generate(prompts, fuzz_xargs(mode, s, layer=layer))
                points.append(summarize(mode, s, examples, outputs, baseline, layer))
    return points


def layer_grid(points: list[SweepPoint], mode: str) -> tuple[list[int], list[float], list[list[float | None]]]:
    """Accuracy of one mode as (depths, strengths, grid[depth][strength]), None where not swept: the heatmap's and
    the report table's data."""
    pts = [p for p in points if p.mode == mode]
    layers = list(dict.fromkeys(p.layer for p in pts))
    strengths = sorted({p.strength for p in pts})
    acc = {(p.layer, p.strength): p.accuracy for p in pts}
    return layers, strengths, [[acc.get((k, s)) for s in strengths] for k in layers]


def offline_generator(llm):
    """Adapter from a vLLM ``LLM`` to the ``generate`` callable of :func:`run_sweep`."""
    from vllm import SamplingParams

    def generate(prompts, xargs):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, extra_args=xargs)
        outs = llm.generate(prompts, params, use_tqdm=False)
        return [(o.outputs[0].text, list(o.outputs[0].token_ids)) for o in outs]

    return generate


def http_generator(base_url: str, api_key: str | None = None, model: str = "fixture", concurrency: int = 32):
    """Adapter from an OpenAI-compatible server (the Serve app, vLLM's server) to :func:`run_sweep`'s ``generate``.

    Greedy completions with ``return_token_ids`` (a vLLM extension), sent
    concurrently; any non-200 answer raises, naming the prompt.
    """
    import asyncio

    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def run(prompts, xargs):
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=300) as client:

            async def one(prompt):
                body = {
                    "model": model,
                    "prompt": prompt,
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0,
                    "return_token_ids": True,
                }
                if xargs:
                    body["vllm_xargs"] = xargs
                async with sem:
                    r = await client.post("/v1/completions", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"{base_url} answered {r.status_code} for {prompt!r}: {r.text[:500]}")
                choice = r.json()["choices"][0]
                return choice["text"], list(choice.get("token_ids") or [])

            return await asyncio.gather(*(one(p) for p in prompts))

    def generate(prompts, xargs):
        return asyncio.run(run(prompts, xargs))

    return generate


def print_table(points: list[SweepPoint]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fuzz sweep (fixture model, greedy)")
    columns = ("mode", "fuzz_layer", "fuzz_strength", "accuracy", "count", "abc", "copy", "outputs changed")
    for col in (*columns, "token divergence"):
        table.add_column(col, justify="right")
    for p in points:
        t = p.accuracy_by_task
        table.add_row(
            p.mode,
            str(p.layer),
            f"{p.strength:g}",
            f"{p.accuracy:.2f}",
            *(f"{t.get(k, 0):.2f}" for k in ("count", "abc", "copy")),
            f"{p.changed_outputs:.2f}",
            f"{p.token_divergence:.2f}",
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="checkpoint (default: build/reuse the fixture model)")
    ap.add_argument("--per-task", type=int, default=30, help="held-out prompts per task")
    ap.add_argument("--layers", type=parse_layers, default=LAYERS, help="fuzz_layer values to sweep (default: 0,1,-1)")
    ap.add_argument("--compile", action="store_true", help="run with torch.compile (enforce_eager=False)")
    ap.add_argument("--json", type=Path, default=None, help="also write the points as JSON here")
    ap.add_argument("--offload-gib", type=float, default=0.25, help="KV offload tier size (GiB)")
    args = ap.parse_args(argv)
    command_logging()
    use_engine_env()

    from fixture_model.build import ensure_model
    from fixture_model.tasks import held_out_examples

    model = args.model or ensure_model()
    from vllm import LLM

    # As every engine of this project: prefix caching and vLLM's native KV
    # offloading on (on CPU through patches/cpu_offload.py).
    llm = LLM(
        model=str(model),
        dtype="float32",
        enforce_eager=not args.compile,
        seed=0,
        max_model_len=1024,
        max_num_seqs=64,
        enable_prefix_caching=True,
        kv_offloading_size=args.offload_gib,
        kv_offloading_backend="native",
    )
    try:
        points = run_sweep(offline_generator(llm), held_out_examples(args.per_task), layers=args.layers)
    finally:
        del llm
    print_table(points)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(p) for p in points], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
