"""``python -m load_tests.observe.replica_metrics``: every replica's prompt-token counters, one scrape of every
node, checked.

Prints one row per engine replica (``--json``: the replicas, unreadable
endpoints and problems as JSON) and exits 1 on any problem: an endpoint
that could not be read, a replica reported by two endpoints, a broken
invariant. The reading is :mod:`load_tests.observe.scraper`'s; the rules are the
load test's own, applied to one scrape as :func:`load_tests.observe.invariants.one_scrape`
says (never negative; the sums only for a replica alive and idle). Without
``--metrics-url`` every node listed in Ray's service-discovery file is read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .counters import SOURCES, ReplicaCounters
from .invariants import one_scrape
from .scraper import discover_metrics_urls, discovery_file, fetch

# What the table's last column says where a replica's rules all hold.
SHOWN = {
    "dead": "dead: last export kept by Ray, sums not checked",
    "busy": "busy: sums checked at rest",
    "at rest": "ok",
}


def table_check(rc: ReplicaCounters) -> tuple[str, list[str]]:
    """(what the table shows, the problems) for one replica of a single scrape."""
    state, findings = one_scrape(rc)
    problems = [f.message for f in findings]
    return "; ".join(problems) or SHOWN[state], problems


def print_table(replicas: dict[str, ReplicaCounters]) -> list[str]:
    """Print one row per replica; return every problem found."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="prompt-token counters per replica")
    for col in (
        "replica",
        "node",
        "alive",
        "requests",
        "prompt_tokens",
        *SOURCES,
        "cached",
        "violations",
        "corrections",
        "sum check",
    ):
        table.add_column(col, justify="left" if col in ("replica", "node", "sum check") else "right")
    found = []
    for key in sorted(replicas):
        rc = replicas[key]
        shown, problems = table_check(rc)
        found += problems
        table.add_row(
            key,
            rc.node,
            "yes" if rc.alive else "no",
            f"{rc.requests_total:g}",
            f"{rc.prompt_tokens:g}",
            *(f"{rc.by_source.get(s, 0):g}" for s in SOURCES),
            f"{rc.prompt_tokens_cached:g}",
            f"{sum(rc.violations.values()):g}",
            f"{sum(rc.corrections.values()):g}",
            shown,
        )
    Console().print(table)
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m load_tests.observe.replica_metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="a node's metrics endpoint, e.g. http://127.0.0.1:8089/metrics (repeat per node); "
        f"default: every node listed in {discovery_file()}",
    )
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    urls = args.metrics_url or discover_metrics_urls()
    result = fetch(urls)
    replicas = result.replicas
    problems = result.problems() + [p for rc in replicas.values() for p in table_check(rc)[1]]
    if args.json:
        print(
            json.dumps(
                {
                    "replicas": {k: asdict(v) for k, v in replicas.items()},
                    "errors": result.errors,
                    "duplicates": result.duplicates,
                    "problems": problems,
                },
                indent=2,
            )
        )
    else:
        print_table(replicas)
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
    if not replicas and not problems:
        print(
            f"no vLLM counters at {', '.join(urls)} (no traffic yet? Ray exports a counter after its first increment)"
        )
    # An unreadable endpoint, a replica reported twice or a broken invariant is an error, as in the load test.
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
