"""The console's view of a run: the summary as a table (the CLI prints it after the report is written)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..results.models import RunSummary
from .markdown import client_cost_line, ingress_retries_line, rates_line, server_ms


def print_summary(console: Console, summary: RunSummary, path: Path) -> None:
    name = summary.scenario.name if summary.scenario else "load test"
    t = Table(title=f"{name}: {'PASSED' if summary.passed else 'FAILED'}")
    t.add_column("")
    t.add_column("")
    t.add_row(
        "requests", f"{summary.started} started; " + ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items()))
    )
    tp = summary.throughput
    t.add_row(
        "throughput", f"{tp.requests_per_s:.2f} req/s ({tp.completed} complete), {tp.output_tokens_per_s:.0f} tok/s"
    )
    t.add_row(
        "goodput",
        f"{tp.goodput_requests_per_s:.2f} req/s ({tp.slo_met} of {tp.completed} met "
        f"{summary.slo.model_dump(exclude_none=True)})",
    )
    for name, p in summary.latency_s:
        t.add_row(
            f"{name.upper()} p50 / p99",
            (
                p.note
                if p.note is not None
                else " / ".join("-" if v is None else f"{v * 1000:.0f} ms" for v in (p.p50, p.p99))
            )
            + f" ({p.requests} requests)",
        )
    if summary.server_latency_s is not None:
        for name in ("ttft", "itl", "tpot"):
            p = getattr(summary.server_latency_s, name)
            t.add_row(
                f"{name.upper()} p50 / p99 (server)",
                f"{server_ms(p, 'p50')} / {server_ms(p, 'p99')} ms ({p.count} values, vLLM's histograms)",
            )
    t.add_row("client", client_cost_line(summary).removeprefix("- the client's own cost: "))
    t.add_row("vs the engines", rates_line(summary.client_server))
    inv = summary.invariants
    if summary.ingress_retries.requests:
        t.add_row("ingress retries", ingress_retries_line(summary))
    t.add_row("invariants", f"{inv.scrapes} scrapes, {inv.violations} violations {inv.by_kind or ''}")
    left = {k for c in summary.planned_faults for k in c.per_replica.get("departures", {})}
    t.add_row(
        "replicas",
        ", ".join(
            k + (" (left as planned)" if r.stale and k in left else " (dead)" if r.stale else "")
            for k, r in summary.replicas.items()
        ),
    )
    if summary.capacity:
        cap = summary.capacity
        t.add_row(
            "capacity",
            ", ".join(
                f"{st.concurrency}: {st.throughput.goodput_requests_per_s:.1f}"
                + ("" if st.meets_slo else " (misses SLO)")
                for st in cap.steps
            )
            + " req/s goodput by requests in flight",
        )
        t.add_row(
            "knee",
            "none met the SLO"
            if cap.knee is None
            else f"{cap.knee} in flight, {cap.knee_goodput_requests_per_s:.2f} req/s goodput; stopped: "
            f"{cap.stopped_because}",
        )
    if summary.repeats:
        for name in ("requests_per_s", "goodput_requests_per_s", "ttft_p99_s", "knee_concurrency"):
            if (sp := summary.repeats.figures.get(name)) is not None:
                t.add_row(
                    f"{name} over {summary.repeats.runs} runs",
                    f"median {sp.median:.3g}, {sp.min:.3g} to {sp.max:.3g} ({sp.relative_spread or 0:.0%} spread)",
                )
    for c in summary.planned_faults:
        t.add_row(f"fault {c.fault}", ("[green]fired[/]" if c.ok else "[red]not shown[/]") + f": {c.evidence}")
    for reason in summary.failures:
        t.add_row("[red]failure[/]", reason)
    console.print(t)
    console.print(f"report: {path}")
