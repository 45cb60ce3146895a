"""One table row per operations run (``redeploy``, ``scale``, ``autoscale``, ``node-loss``): what a client saw
while the replica set changed.

docs/load_tests.md keeps a table of every acceptance run of an operation
(issue 34): refusals at the ingress, streams cut, time to converge, the
time to first token while the change ran and the goodput it left, against
the same load before the first change. Both sides of that comparison come
from the same run: "before" is the steady load from :data:`WARMUP_S` after
the start to the first change (the run's own baseline, same streams, same
mix, same deployment, so nothing else differs); "during" is from the first
change to the last one's convergence. The figures are read back from the
run's ``summary.json`` (typed) and ``requests.jsonl`` (one line per request),
and judged by the run's own SLO (:meth:`load_tests.plan.slo.Slo.met`).

    python -m load_tests.report.operation_table out/redeploy-1 out/redeploy-2 ...
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..judge.figures import percentiles
from ..load.client import RequestResult
from ..load.outcomes import OK_OUTCOMES, Outcome
from ..plan.slo import Slo
from ..results.events import Autoscaled, NodeLost, Redeployed, Scaled
from ..results.models import RunSummary

# The first seconds of a run fill the streams and the engines' batches: not the steady load a change meets.
WARMUP_S = 10.0
# A stream or a connection that ended without its answer (a 5xx or a refusal is a failure, not a cut).
CUT: tuple[Outcome, ...] = ("stream_error", "transport_error", "truncated", "timeout")


@dataclass(frozen=True)
class Window:
    """A span of a run, seconds since it started; a request belongs to the span its start falls in."""

    start: float
    end: float

    def holds(self, r: RequestResult) -> bool:
        return self.start <= r.start < self.end


@dataclass(frozen=True)
class OperationRow:
    """What a client saw while one run changed its replica set."""

    run: str
    passed: bool
    requests: int
    refused: int
    failed: int
    cut: int
    converged_s: list[float | None]
    ttft_p99_before_s: float | None
    ttft_p99_during_s: float | None
    ttft_requests_during: int
    goodput_before: float | None
    goodput_during: float | None

    def markdown(self) -> str:
        def s(x: float | None, fmt: str = "{:.1f}") -> str:
            return "-" if x is None else fmt.format(x)

        ratio = (
            None
            if not self.goodput_before or self.goodput_during is None
            else self.goodput_during / self.goodput_before
        )
        converged = ", ".join(s(c, "{:.0f} s") for c in self.converged_s) or "-"
        return (
            f"| {self.run} | {'passed' if self.passed else '**FAILED**'} | {self.requests} | {self.refused} | "
            f"{self.failed} / {self.cut} | {converged} | {s(self.ttft_p99_before_s)} / {s(self.ttft_p99_during_s)} s "
            f"({self.ttft_requests_during}) | {s(self.goodput_before)} / {s(self.goodput_during)} req/s "
            f"({s(ratio, '{:.2f}x')}) |"
        )


HEADER = (
    "| run | verdict | requests | refused at the ingress | failed / of them cut | converged | TTFT p99 before / during "
    "(streams during) | goodput before / during |\n|---|---|---|---|---|---|---|---|"
)


def _goodput(rows: Sequence[RequestResult], window: Window, slo: Slo) -> float | None:
    """Requests per second that met ``slo``, of those started in ``window``."""
    span = window.end - window.start
    if span <= 0:
        return None
    met = sum(slo.met(r) for r in rows if window.holds(r))
    return met / span


def _ttft_p99(rows: Sequence[RequestResult], window: Window) -> tuple[float | None, int]:
    ttfts = [r.ttft for r in rows if window.holds(r) and r.outcome == "ok" and r.ttft is not None]
    p = percentiles(ttfts, (99,))
    return p["p99"], len(ttfts)


def operation_row(run: str, summary: RunSummary, rows: Sequence[RequestResult]) -> OperationRow:
    """The row of one run: its summary and its requests' lines."""
    changes = list(summary.faults)
    if not changes:
        raise ValueError(f"{run}: the run changed nothing (no fault or step in its summary)")
    steps = [f for f in changes if isinstance(f, Redeployed | Scaled | Autoscaled | NodeLost)]
    first = min(f.t for f in changes)
    # a step that never converged runs its window to the last request
    last = max((f.converged_t if f.converged_t is not None else float("inf") for f in steps), default=first)
    last = min(last, max(r.start for r in rows) + 1e-9)
    before, during = Window(WARMUP_S, first), Window(first, last)
    ttft_before, _ = _ttft_p99(rows, before)
    ttft_during, n_during = _ttft_p99(rows, during)
    return OperationRow(
        run=run,
        passed=summary.passed,
        requests=len(rows),
        refused=summary.ingress_retries.requests,
        failed=sum(r.outcome not in OK_OUTCOMES for r in rows),
        cut=sum(r.outcome in CUT for r in rows),
        converged_s=[f.converge_s for f in steps],
        ttft_p99_before_s=ttft_before,
        ttft_p99_during_s=ttft_during,
        ttft_requests_during=n_during,
        goodput_before=_goodput(rows, before, summary.slo),
        goodput_during=_goodput(rows, during, summary.slo),
    )


def read_run(out: Path) -> OperationRow:
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    lines = (out / "requests.jsonl").read_text().splitlines()
    rows = [RequestResult.from_json(json.loads(line)) for line in lines if line.strip()]
    return operation_row(out.name, summary, rows)


def table(outs: Iterable[Path]) -> str:
    return "\n".join([HEADER, *(read_run(o).markdown() for o in outs)])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="a run's --out directory")
    args = ap.parse_args(argv)
    print(table(args.runs))


if __name__ == "__main__":
    main()
