"""``python -m patches.matrix``: the fuzz patch on every architecture of the matrix, eager and compiled.

In the project's environment, as every command of the project (``source scripts/env.sh`` first: the engines read
no model hub and a bounded CPU KV cache from it):

    python -m patches.matrix                          # every architecture, eager and compiled (~25 min on 2 cores)
    python -m patches.matrix --arch olmo2 gpt_neox --mode eager
    python -m patches.matrix --patches-off fuzz --arch olmo2   # the negative control: must fail
    python -m patches.matrix --patches-off fuzz_layer --arch llama   # the deeper settings refused: must fail
    python -m patches.matrix --layer-offset -1 --arch llama    # the planted off-by-one layer: must fail
    python -m patches.matrix --json out/matrix.json --markdown out/matrix.md

Exit status 0 only when every row passes (every request equal to the
reference or a near-tie, its second pass served from the prefix cache, the
worker's fuzz counters moved, vLLM's backend the one the matrix expects).
The markdown table is what docs/fuzz.md shows for the last full run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from pathlib import Path

from .architectures import ARCHITECTURES, INIT_RANGE
from .run import MODES, ArchitectureResult, run_architecture

log = logging.getLogger("patches.matrix")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m patches.matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", nargs="+", choices=list(ARCHITECTURES), default=list(ARCHITECTURES))
    p.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--patches-off", default="", help="FUZZSERVE_PATCHES_OFF in the engines (the negative control)")
    p.add_argument(
        "--layer-offset",
        type=int,
        default=0,
        help="the reference perturbs this many layers off the requested one (the planted off-by-one control)",
    )
    p.add_argument(
        "--init-range",
        type=float,
        default=INIT_RANGE,
        help=f"the random weights' initializer range (default {INIT_RANGE}; the families' own is 0.02)",
    )
    p.add_argument("--json", type=Path, help="write every row and request verdict here")
    p.add_argument("--markdown", type=Path, help="write the table here (docs/fuzz.md's form)")
    return p.parse_args(argv)


def _neutral_dlogprob(r: ArchitectureResult) -> float:
    """The largest engine-vs-reference log-prob difference over the neutral requests: the numerics, with no fuzz."""
    neutral = [c.max_dlogprob for c in r.cases if c.label.endswith((" none", " scale 0")) and c.verdict != "refused"]
    return max(neutral, default=float("nan"))


def _served_max(r: ArchitectureResult) -> float:
    """The largest engine-vs-reference log-prob difference over the requests served (a refusal has none)."""
    return max((c.max_dlogprob for c in r.cases if c.verdict != "refused"), default=float("nan"))


def markdown(results: list[ArchitectureResult], header: str) -> str:
    lines = [
        header,
        "",
        (
            "| architecture | vLLM backend | mode | requests | equal | near-tie | float-noise | differs | refused "
            "| max dlogprob, s = 0 | max dlogprob, all | cached tokens, pass 2 | verdict |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.counts()
        if r.refused:
            lines.append(
                f"| {r.name} | {r.backend} | {r.mode} | - | - | - | - | - | - | - | - | refused: {r.refused} |"
            )
            continue
        lines.append(
            f"| {r.name} | {r.backend} | {r.mode} | {len(r.cases)} | {c['equal']} | {c['near-tie']} "
            f"| {c['float-noise']} | {c['differs']} "
            f"| {c['refused']} | {_neutral_dlogprob(r):.1e} | {_served_max(r):.1e} "
            f"| {min(x.cached_tokens for x in r.cases)}-{max(x.cached_tokens for x in r.cases)} "
            f"| {'pass' if r.ok else 'FAIL'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import vllm
    from rich.console import Console
    from rich.progress import Progress

    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    jobs = [(a, m) for m in args.mode for a in args.arch]
    results: list[ArchitectureResult] = []
    with Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("fuzz matrix", total=len(jobs))
        for arch, mode in jobs:
            progress.update(task, description=f"{arch} ({mode})")
            r = run_architecture(
                arch, mode, patches_off=args.patches_off, init_range=args.init_range, layer_offset=args.layer_offset
            )
            results.append(r)
            progress.console.print(
                f"{arch:9s} {mode:8s} {r.backend:12s} {'pass' if r.ok else 'FAIL'} {r.counts()} "
                f"{r.refused or ''} ({r.seconds:.0f} s)"
            )
            progress.advance(task)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"Fuzz matrix, {stamp}, vLLM {vllm.__version__}"
        + (f", FUZZSERVE_PATCHES_OFF={args.patches_off}" if args.patches_off else "")
        + (f", reference planted {args.layer_offset:+d} layer" if args.layer_offset else "")
        + f", weights initialised at {args.init_range:g}"
        + f": `python -m patches.matrix {' '.join(argv if argv is not None else sys.argv[1:])}`".rstrip()
    )
    table = markdown(results, header)
    print(table)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"header": header, "vllm": vllm.__version__, "rows": [r.to_json() for r in results]}
        args.json.write_text(json.dumps(payload, indent=1))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
