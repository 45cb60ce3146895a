"""Routing calls a stopped ingress request router answered after Serve's default drain: the router linger at work.

A redeploy replaces the ingress request routers, and an old HAProxy process
keeps serving a client's kept connection with its old router pool. Serve's
default (``graceful_shutdown_wait_loop_s`` 2 s) closes a stopped router's
port 2 s after the stop; the project's routers stay for
``serve_app.engine.direct_server.ROUTER_LINGER_S``. Every routing call a router
answered later than :data:`SERVE_DEFAULT_DRAIN_S` after its stop came from
a HAProxy process whose pool still named it, and would have met a closed
port without the linger (a refusal, unless that pool named a live router as
well). This reads the count from Serve's own logs: the controller's "Stopping
Replica(id=..., deployment='LLMRouter')" lines and each router replica's
access lines ("POST __call__ 200").

    python -m load_tests.report.router_linger $RAY_TMPDIR/ray/session_latest/logs/serve
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SERVE_DEFAULT_DRAIN_S = 2.0
_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"
_STOP = re.compile(_STAMP + r" .*Stopping Replica\(id='(\w+)', deployment='LLMRouter'")
_CALL = re.compile(_STAMP + r" .* POST \S+ 200 ")


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")


@dataclass(frozen=True)
class LateCalls:
    """One stopped router: when Serve stopped it, and the offsets (s) of the calls it answered past the default."""

    router: str
    stopped: dt.datetime
    late_s: tuple[float, ...]


def router_stops(controller_lines: Iterable[str]) -> dict[str, dt.datetime]:
    """Router replica id -> when the controller stopped it."""
    return {m.group(2): _time(m.group(1)) for line in controller_lines if (m := _STOP.search(line))}


def late_calls(router: str, stopped: dt.datetime, replica_lines: Iterable[str]) -> LateCalls:
    """The calls ``router`` answered more than :data:`SERVE_DEFAULT_DRAIN_S` after ``stopped``."""
    offsets = ((_time(m.group(1)) - stopped).total_seconds() for line in replica_lines if (m := _CALL.search(line)))
    return LateCalls(router, stopped, tuple(s for s in offsets if s > SERVE_DEFAULT_DRAIN_S))


def read_logs(serve_logs: Path) -> list[LateCalls]:
    """Every stopped router of a Serve log directory (``<ray session>/logs/serve``), in stop order."""
    stops = router_stops(line for f in sorted(serve_logs.glob("controller_*.log")) for line in f.open())
    out = []
    for router, stopped in sorted(stops.items(), key=lambda kv: kv[1]):
        lines = (line for f in serve_logs.glob(f"replica_*_LLMRouter_{router}.log") for line in f.open())
        out.append(late_calls(router, stopped, lines))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("serve_logs", type=Path, help="a Ray session's logs/serve directory")
    args = ap.parse_args(argv)
    rows = read_logs(args.serve_logs)
    for r in rows:
        last = f", the last {max(r.late_s):.1f} s after" if r.late_s else ""
        print(
            f"router {r.router} stopped {r.stopped:%H:%M:%S}: {len(r.late_s)} calls answered later than "
            f"{SERVE_DEFAULT_DRAIN_S:g} s after its stop{last}"
        )
    print(f"total: {sum(len(r.late_s) for r in rows)}")


if __name__ == "__main__":
    main()
