"""Benchmark: what one structured-output spec under the guard's byte cap costs the engine to compile.

    python -m benchmarks.investigations.grammar_cost [--vocabularies fixture,32000,128000] [--threads 8]
        [--timeout-s 600] [--out DIR]

vLLM 0.32 turns a request's spec (a JSON schema, a regex, a grammar, the
tools) into an xgrammar grammar and compiles it against the tokenizer's
vocabulary, once per request, in EngineCore's grammar thread pool, with no
time limit; only a bare regex has one (``VLLM_REGEX_COMPILATION_TIMEOUT_S``,
5 s, and the compile's thread runs on past it). The guard caps the spec's
size (``guard.limits.max_grammar_bytes``, 16 KiB), and the question this
benchmark answers is whether size bounds cost. It takes the largest
instance of each spec shape under the cap, and a few short ones that look
harmless, validates each as vLLM's frontend does (``Grammar.from_json_schema``
/ ``from_regex``: ``convert_s``) and compiles it as vLLM's xgrammar backend
does (``GrammarCompiler(max_threads=8)``, ``compile_json_schema`` /
``compile_regex``: ``compile_s``; the compiler's cache off, as for a spec
never seen before), against the fixture model's tokenizer and against
synthetic vocabularies of real models' sizes (random strings). The compile
walks the vocabulary per grammar state, so a vocabulary's size sets the
scale; its content counts too, so the synthetic figures show the scale,
not what a given real tokenizer costs. Each compile runs in a child process
with a time limit, one at a time; run it on an idle host.

The answer (docs/security.md, work the size cap does not bound) is why the
shipped config refuses structured outputs (``limits.structured_outputs:
false``): a 49-byte JSON schema with a ``pattern`` compiles in a few
hundredths of a second with the fixture's 239 tokens and for minutes with a
128k vocabulary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import queue
import random
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from load_tests.command_logs import command_logging
from serve_app.ingress.xargs_policy import DEFAULT_LIMITS, grammar_bytes, grammar_specs

log = logging.getLogger("fuzzserve.benchmarks.grammar_cost")
REPO = Path(__file__).resolve().parents[2]
FIXTURE = "fixture"
ALPHABET = string.ascii_letters + string.digits + ' _-.,:;"{}[]()'


def spec_bytes(spec: dict[str, Any]) -> int:
    """The size the guard measures for a body that carries ``spec`` as its ``structured_outputs``."""
    return grammar_bytes(grammar_specs({"structured_outputs": spec}))


def largest_under(cap: int, build: Callable[[int], dict[str, Any]], step: int = 1) -> dict[str, Any]:
    """``build(n)`` for the largest ``n`` (in steps of ``step``) whose spec is within ``cap`` bytes."""
    n, best = 1, None
    while spec_bytes(spec := build(n)) <= cap:
        best, n = spec, n + step
    if best is None:
        raise ValueError(f"even the smallest instance is over {cap} bytes")
    return best


def _optional_properties(n: int) -> dict[str, Any]:
    return {"json": {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}}


def _any_of_objects(n: int) -> dict[str, Any]:
    return {
        "json": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"a{i}": {"type": "string"}, f"b{i}": {"type": "integer"}},
                    "required": [f"a{i}"],
                }
                for i in range(n)
            ]
        }
    }


def _ref_chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}, "required": ["x"]}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "string"}
    return {"json": {"$defs": defs, "$ref": "#/$defs/d0"}}


def specs(cap: int = DEFAULT_LIMITS.max_grammar_bytes) -> dict[str, dict[str, Any]]:
    """Spec shapes, each within ``cap`` bytes as the guard counts them."""
    return {
        "small JSON object (baseline)": {
            "json": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
        },
        "optional properties, as many as fit": largest_under(cap, _optional_properties, 10),
        "anyOf of objects, as many as fit": largest_under(cap, _any_of_objects, 5),
        "$ref chain, as long as fits": largest_under(cap, _ref_chain, 10),
        "string pattern ([a-z]{0,50}){0,50}": {"json": {"type": "string", "pattern": "([a-z]{0,50}){0,50}"}},
        "string pattern ((a|...|h){1,30}x){1,30}": {
            "json": {"type": "string", "pattern": "((a|b|c|d|e|f|g|h){1,30}x){1,30}"}
        },
        "regex ([a-z]{0,50}){0,50}": {"regex": "([a-z]{0,50}){0,50}"},
    }


def tokenizer_info(vocabulary: str):
    """xgrammar's view of a vocabulary: the fixture model's tokenizer, or ``N`` distinct random strings."""
    import xgrammar as xgr

    if vocabulary == FIXTURE:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(REPO / ".cache" / "models" / "fixture")
        return xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)), len(tok)
    size, rng, vocab = int(vocabulary), random.Random(0), set[str]()
    while len(vocab) < size:
        vocab.add("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 8))))
    return xgr.TokenizerInfo(sorted(vocab), vocab_type=xgr.VocabType.RAW, stop_token_ids=[0]), size


STARTUP_S = 300.0  # a child building its vocabulary for longer than this is stuck, not slow


def _compile(vocabulary: str, spec: dict[str, Any], threads: int, out) -> None:
    import xgrammar as xgr

    info, size = tokenizer_info(vocabulary)
    compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)
    out.put({"started": True, "vocab_size": size})  # the vocabulary is built: what follows is the spec's own cost
    t0 = time.perf_counter()
    if "json" in spec:
        text = json.dumps(spec["json"])
        xgr.Grammar.from_json_schema(text)  # the frontend's validation
        t1 = time.perf_counter()
        compiler.compile_json_schema(text, any_whitespace=True)
    else:
        xgr.Grammar.from_regex(spec["regex"])
        t1 = time.perf_counter()
        compiler.compile_regex(spec["regex"])
    out.put({"convert_s": t1 - t0, "compile_s": time.perf_counter() - t1})


def measure(
    vocabulary: str, spec: dict[str, Any], timeout_s: float, threads: int = 8, startup_s: float = STARTUP_S
) -> dict[str, Any]:
    """Validate + compile ``spec`` in a child process. ``started``: the child had built the vocabulary and begun
    on the spec; ``timed_out``: its work on the spec ran past ``timeout_s`` (and it was killed), counted from its
    ``started`` message, so that a slow start (imports, the vocabulary: seconds on a busy 2-core host) is never
    read as the spec's cost; a child not started within ``startup_s`` is killed as well (``started`` False)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    child = ctx.Process(target=_compile, args=(vocabulary, spec, threads, out), daemon=True)
    t0 = time.perf_counter()
    child.start()
    posted: dict[str, Any] = {}
    while not posted.get("started") and child.is_alive() and time.perf_counter() - t0 < startup_s:
        with contextlib.suppress(queue.Empty):
            posted.update(out.get(timeout=0.1))
    if posted.get("started"):
        child.join(timeout_s)
    timed_out = child.is_alive()
    if timed_out:
        child.kill()
        child.join()
    wall_s = time.perf_counter() - t0
    while True:
        try:
            posted.update(out.get(timeout=1))
        except queue.Empty:
            break
    result = {"started": bool(posted.pop("started", False)), "timed_out": timed_out, "wall_s": wall_s, **posted}
    if not timed_out and child.exitcode != 0:
        result["error"] = f"exit code {child.exitcode}"
    return result


def markdown(results: list[dict[str, Any]], command: str, threads: int) -> str:
    vocabularies = list(dict.fromkeys(r["vocabulary"] for r in results))
    sizes = {r["vocabulary"]: r["vocab_size"] for r in results if "vocab_size" in r}  # as each child built it
    lines = [
        (
            f"# grammar compile cost under the {DEFAULT_LIMITS.max_grammar_bytes}-byte cap "
            f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
        ),
        "",
        f"Command: `{command}`",
        "",
        (
            f"One compile per cell (validation + compile, xgrammar with max_threads={threads}), seconds; "
            "`>` = killed at the time limit."
        ),
        "",
        "| spec | bytes | " + " | ".join(f"{v} ({sizes.get(v, '?')} tokens)" for v in vocabularies) + " |",
        "|---|---|" + "---|" * len(vocabularies),
    ]
    for name in dict.fromkeys(r["spec"] for r in results):
        row = {r["vocabulary"]: r for r in results if r["spec"] == name}
        cells = []
        for v in vocabularies:
            r = row[v]
            cells.append(
                f"> {r['wall_s']:.0f}" if r["timed_out"] else r.get("error") or f"{r['convert_s'] + r['compile_s']:.2f}"
            )
        label = name.replace("|", "\\|")  # a pipe inside a cell would split it
        lines.append(f"| {label} | {row[vocabularies[0]]['bytes']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--vocabularies",
        default=f"{FIXTURE},32000,128000",
        help="comma-separated: 'fixture' (the fixture model's tokenizer) or a vocabulary size",
    )
    ap.add_argument("--timeout-s", type=float, default=600.0, help="time limit per compile (the child is killed)")
    ap.add_argument("--threads", type=int, default=8, help="xgrammar's compile threads (vLLM 0.32 uses 8)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "grammar_cost")
    args = ap.parse_args()
    command_logging()
    results = []
    for vocabulary in args.vocabularies.split(","):
        for name, spec in specs().items():
            r = {
                "vocabulary": vocabulary,
                "spec": name,
                "bytes": spec_bytes(spec),
                **measure(vocabulary, spec, args.timeout_s, args.threads),
            }
            log.info("%s, %s: %s", vocabulary, name, {k: v for k, v in r.items() if k not in ("vocabulary", "spec")})
            results.append(r)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "grammar_cost.json").write_text(json.dumps({"results": results, "specs": specs()}, indent=1))
    command = "python -m benchmarks.investigations.grammar_cost " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"
    )
    (args.out / "grammar_cost.md").write_text(markdown(results, command, args.threads))
    log.info("written: %s", args.out / "grammar_cost.md")


if __name__ == "__main__":
    main()
