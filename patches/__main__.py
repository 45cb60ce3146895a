# The formatter would dedent the usage lines of this docstring, which is --help's text (description=__doc__).
# fmt: off
"""``python -m patches``: the index of every change the patches make to vLLM, and its check against a vLLM.

    python -m patches --list                 # the index (docs/patches.md is this output)
    python -m patches --check                # every symbol against the installed vLLM; exit 1 if one moved
    python -m patches --check-against DIR    # the same against a vLLM source tree (e.g. an unpacked newer sdist)
    python -m patches --check-against vllm-0.33.0.tar.gz    # or the sdist itself (`pip download --no-binary :all:
                                                            # --no-deps vllm==0.33.0`)
"""
# fmt: on

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m patches", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print the index of every patched symbol (Markdown)")
    what.add_argument(
        "--check",
        action="store_true",
        help="check every symbol against the installed vLLM (imported, and its source read)",
    )
    what.add_argument(
        "--check-against",
        type=Path,
        metavar="DIR",
        help="check every symbol against the vLLM source tree in DIR (DIR/vllm/ or DIR itself the "
        "vllm package), or in a vLLM sdist (.tar.gz); nothing is imported from it",
    )
    args = ap.parse_args(argv)

    from .framework.registry import index_markdown, patches

    if args.list:
        sys.stdout.write(index_markdown())
        return 0
    from .framework.upstream_check import check_installed, check_tree, report

    try:
        found = check_installed(patches()) if args.check else check_tree(patches(), args.check_against)
    except FileNotFoundError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    sys.stdout.write(report(found))
    return 1 if any(f.problems for f in found) else 0


if __name__ == "__main__":
    sys.exit(main())
