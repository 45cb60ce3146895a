"""``report.md``: a run's summary as Markdown (the numbers, the verdict's reasons, the planned faults' evidence,
the counters per replica, the capacity search and repeats when there are)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ..load.fuzz_sweep import layer_grid
from ..results.models import Capacity, ClientServer, HostileVerdict, Repeats, RunSummary, ServerPercentiles


def ingress_retries_line(summary: RunSummary) -> str:
    """The refusals at the ingress the client sent again, in one line (the report and the CLI table)."""
    ir = summary.ingress_retries
    return (
        (
            f"{ir.requests} request(s), {ir.answered} answered on a retry; refusals {ir.refusals} "
            f"(docs/load_tests.md#refused-at-the-ingress)"
        )
        if ir.requests
        else "none"
    )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def markdown(summary: RunSummary, title: str, sweep=None, images: Sequence[str] = ()) -> str:
    verdict = "PASSED" if summary.passed else "FAILED"
    lines = [f"# {title}", "", f"**{verdict}**" + ("" if summary.passed else ": " + "; ".join(summary.failures)), ""]
    lines += _load_lines(summary)
    lines += _errors_lines(summary)
    lines += _planned_faults_lines(summary)
    lines += [f"Replicas that died without the run killing them: {summary.unexpected_replica_deaths or 'none'}", ""]
    if summary.capacity:
        lines += capacity_lines(summary.capacity)
    if summary.repeats:
        lines += repeats_lines(summary.repeats)
    lines += _probes_lines(summary)
    if summary.hostile:
        lines += hostile_lines(summary.hostile)
    lines += _invariants_lines(summary)
    lines += _replica_lines(summary)
    lines += _client_server_lines(summary.client_server)
    if sweep:
        lines += sweep_lines(sweep)
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images]
    return "\n".join(lines) + "\n"


def _load_lines(summary: RunSummary) -> list[str]:
    """The load: requests and outcomes, throughput and goodput, the client's latency table, the client's cost."""
    t = summary.throughput
    lines = [
        "## Load",
        "",
        f"{summary.started} requests in {summary.wall_s:.0f} s; outcomes: "
        + ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())),
        "",
        (
            f"- throughput: {t.requests_per_s:.2f} req/s ({t.completed} complete answers), "
            f"{t.output_tokens_per_s:.1f} output tokens/s"
        ),
        (
            f"- goodput: {t.goodput_requests_per_s:.2f} req/s ({t.slo_met} of the {t.completed} complete answers) "
            f"meeting {summary.slo.model_dump()}: streams on TTFT and TPOT, the rest on end-to-end time "
            f"(docs/load_tests.md#figures)"
        ),
        "",
        "| latency (ms) | requests | values | p50 | p90 | p95 | p99 | mean |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, p in summary.latency_s:
        figures = (
            f"{_ms(p.p50)} | {_ms(p.p90)} | {_ms(p.p95)} | {_ms(p.p99)} | {_ms(p.mean)}"
            if p.note is None
            else f"{p.note} | | | |"
        )
        lines.append(f"| {name} | {p.requests} | {p.count} | {figures} |")
    lines += server_latency_rows(summary)
    return [*lines, "", client_cost_line(summary)]


def _errors_lines(summary: RunSummary) -> list[str]:
    """The errors: unexpected ones by kind and message, those the faults explain, and the first unexpected one."""
    faults = [f.model_dump(mode="json", exclude_none=True) for f in summary.faults]
    lines = [
        "",
        "## Errors",
        "",
        f"- unexpected, by kind: {summary.errors_by_kind or 'none'}",
        f"- unexpected, most common messages: {summary.errors_by_message or 'none'}",
        f"- explained by injected faults: {summary.errors_explained_by_faults or 'none'}",
        f"- refused at the ingress and sent again: {ingress_retries_line(summary)}",
        (
            f"- bad requests sent {summary.bad_requests.sent}, refused naming the field "
            f"{summary.bad_requests.rejected_naming_the_field}"
        ),
        f"- faults injected: {faults or 'none'}",
        "",
    ]
    if summary.first_unexpected_errors:
        lines += [
            "First unexpected error:",
            "",
            "```json",
            json.dumps(summary.first_unexpected_errors[0], indent=1)[:3000],
            "```",
            "",
        ]
    return lines


def _planned_faults_lines(summary: RunSummary) -> list[str]:
    """Each planned fault: whether it fired and whether the run shows it, with the evidence; none when unplanned."""
    if not summary.planned_faults:
        return []
    lines = ["## Planned faults", "", "| fault | fired | shown | evidence | problems |", "|---|---|---|---|---|"]
    lines += [
        f"| {c.fault} | {c.fired} | {'yes' if c.ok else '**no**'} | {c.evidence} | {'; '.join(c.problems) or '-'} |"
        for c in summary.planned_faults
    ]
    return [*lines, ""]


def _probes_lines(summary: RunSummary) -> list[str]:
    """The greedy probes sent under faults and compared with the fault-free deployment's answers, when sent."""
    p = summary.probes
    if not p:
        return []
    return [
        "## Greedy probes under faults vs the fault-free deployment",
        "",
        (
            f"{p.rounds} rounds, {p.sent} probes sent, {p.compared} answered and compared, "
            f"{p.equal} equal to the fault-free answer, {p.failed} failed (judged with the other "
            f"requests); problems: {'; '.join(p.problems) or 'none'}"
        ),
        "",
    ]


def _invariants_lines(summary: RunSummary) -> list[str]:
    """The counter invariants: scrapes, violations (the first in full), those the injected faults explain."""
    inv = summary.invariants
    lines = [
        "## Counter invariants",
        "",
        (
            f"{inv.scrapes} scrapes (scrape time p50 {_ms(inv.scrape_seconds.p50)} ms, max "
            f"{_ms(inv.scrape_seconds.p99)} ms; failed scrapes {inv.failed_scrapes}); "
            f"violations: {inv.violations} {inv.by_kind or ''}; "
            f"accounting violations expected from injected faults: {inv.expected_accounting_violations or 'none'}"
        ),
        "",
    ]
    if inv.first_violation:
        lines += [
            "First violation, full context:",
            "",
            "```json",
            json.dumps(asdict(inv.first_violation), indent=1, default=str)[:4000],
            "```",
            "",
        ]
    return lines


def _replica_lines(summary: RunSummary) -> list[str]:
    """The counters per replica: prompt tokens by source, requests finished, violations and corrections."""
    lines = [
        (
            "| replica | node | stale | prompt_tokens | local_compute | local_cache_hit | external_kv_transfer "
            "| finished | violations | corrections |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, r in sorted(summary.replicas.items()):
        bs = r.by_source
        lines.append(
            f"| {k} | {r.node} | {r.stale} | {r.prompt_tokens:g} | {bs.get('local_compute', 0):g} | "
            f"{bs.get('local_cache_hit', 0):g} | {bs.get('external_kv_transfer', 0):g} | "
            f"{sum(r.requests_finished.values()):g} | {r.violations or 0} | {r.corrections or 0} |"
        )
    return lines


def _client_server_lines(cs: ClientServer) -> list[str]:
    """What the clients got beside what the engines counted, and the two sides' rates."""
    return [
        "",
        (
            f"Client/server: clients got {cs.client_ok} complete answers and cancelled {cs.client_cancelled}; "
            f"engines completed {cs.engine_completed:g} and finished {cs.engine_finished:g} in all "
            f"({cs.sent_past_router} requests got past the router). {cs.note or ''}"
        ),
        "",
        rates_line(cs),
        "",
    ]


def sweep_lines(sweep) -> list[str]:
    """The fuzz sweep: task accuracy by depth x strength per mode (the heatmap's numbers), then every point."""
    lines = ["## Fuzz sweep (greedy, through the deployment)", ""]
    for mode in dict.fromkeys(p.mode for p in sweep):
        layers, strengths, grid = layer_grid(sweep, mode)
        lines += [
            (
                f"Task accuracy, {mode} mode, by `fuzz_layer` (rows; 0: the input embeddings, -1: after the last "
                "decoder layer) and `fuzz_strength` (columns):"
            ),
            "",
            "| fuzz_layer | " + " | ".join(f"{s:g}" for s in strengths) + " |",
            "|---|" + "---|" * len(strengths),
        ]
        lines += [
            f"| {k} | " + " | ".join("-" if a is None else f"{a:.2f}" for a in row) + " |"
            for k, row in zip(layers, grid, strict=True)
        ]
        lines.append("")
    lines += [
        "| mode | fuzz_layer | fuzz_strength | accuracy | outputs changed | token divergence |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {p.mode} | {p.layer} | {p.strength:g} | {p.accuracy:.2f} | {p.changed_outputs:.2f} "
        f"| {p.token_divergence:.2f} |"
        for p in sweep
    ]
    lines.append("")
    return lines


def capacity_lines(cap: Capacity) -> list[str]:
    knee = (
        "none: no step met the SLO"
        if cap.knee is None
        else (f"**{cap.knee} in flight**, {cap.knee_goodput_requests_per_s:.2f} req/s goodput")
    )
    plan = cap.plan
    lines = [
        "## Capacity search (profile sweep)",
        "",
        (
            f"Steps of {plan.step_s:g} s at 1, 2, 4, ... in flight. Knee (the highest load whose goodput is within "
            f"{plan.knee_within:.0%} of the best, {cap.best_goodput_requests_per_s:.2f} req/s, and at which at least "
            f"{plan.slo_attainment:.0%} of the complete answers met the SLO, with no invariant violation and at most "
            f"{plan.error_budget:.0%} failures): {knee}. Stopped: {cap.stopped_because}."
        ),
        "",
        (
            "| in flight | requests | req/s | goodput | SLO met | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | "
            "failures | violations | meets SLO |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for st in cap.steps:
        t, lat = st.throughput, st.latency_s
        met = "-" if st.slo_attainment is None else f"{st.slo_attainment:.0%}"
        lines.append(
            f"| {st.concurrency} | {st.started} | {t.requests_per_s:.2f} | {t.goodput_requests_per_s:.2f} | "
            f"{met} | {_ms(lat.ttft.p50)} / {_ms(lat.ttft.p99)} ({lat.ttft.requests}) | "
            f"{_ms(lat.tpot.p50)} / {_ms(lat.tpot.p99)} ({lat.tpot.requests}) | {st.unexpected_failures} | "
            f"{st.violations} {' '.join(st.violation_kinds)} | {'yes' if st.meets_slo else 'no'} |"
        )
    return [*lines, ""]


def repeats_lines(rep: Repeats) -> list[str]:
    def fmt(name: str, v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v * 1000:.0f} ms" if name.endswith("_s") else f"{v:.2f}"

    lines = [
        f"## {rep.runs} runs ({rep.passed} passed)",
        "",
        "| figure | median | min | max | spread | each run |",
        "|---|---|---|---|---|---|",
    ]
    for name, sp in rep.figures.items():
        spread = "-" if sp.relative_spread is None else f"{sp.relative_spread:.0%}"
        lines.append(
            f"| {name} | {fmt(name, sp.median)} | {fmt(name, sp.min)} | {fmt(name, sp.max)} | {spread} | "
            + ", ".join(fmt(name, v) for v in sp.values)
            + " |"
        )
    return [
        *lines,
        "",
        "Each run's report: " + ", ".join(f"[{Path(d).name}]({Path(d).name}/report.md)" for d in rep.reports),
        "",
    ]


def hostile_lines(h: HostileVerdict) -> list[str]:
    lines = [
        "## Hostile clients",
        "",
        f"Normal goodput: {h.calm_goodput_requests_per_s or 0:.2f} req/s over the calm windows, "
        f"{h.hostile_goodput_requests_per_s or 0:.2f} over the hostile ones"
        + (
            f" ({h.goodput_drop:+.1%} drop; bound {h.goodput_drop_bound:.0%}; per ABBA block: "
            + ", ".join(f"{d:+.1%}" for d in h.block_drops)
            + ")"
            if h.goodput_drop is not None
            else ""
        )
        + f". Problems: {'; '.join(h.problems) or 'none'}.",
        "",
        "| window | start (s) | normal requests | met the SLO | goodput (req/s) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {w.kind} | {w.t_start:.0f} | {w.normal_started} | {w.normal_slo_met} | {w.goodput_requests_per_s:.2f} |"
        for w in h.windows
    ]
    lines += ["", "| hostile request | sent | answered as expected | otherwise |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['sent']} | {v['answered_as_expected']} | {v['otherwise']} |" for k, v in h.requests.items()]
    lines += [
        "",
        "| hostile connection | opened | closed within the bound | slowest close (s) | bound (s) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {k} | {v['opened']} | {v['closed_within_bound']} | {v['slowest_close_s']} | {v['bound_s']} |"
        for k, v in h.connections.items()
    ]
    return [*lines, ""]


PERCENTILE_KEYS = ("p50", "p90", "p95", "p99")


def server_ms(p: ServerPercentiles, key: str) -> str:
    """A server percentile in ms with the bucket it was interpolated in: ``24 (20-30)``."""
    v = getattr(p, key)
    if v is None:
        return "-"
    lo, hi = p.bucket_s[key]
    return f"{v * 1000:.0f} ({lo * 1000:g}-{hi * 1000:g})"


def server_latency_rows(summary: RunSummary) -> list[str]:
    """The server's own TTFT / ITL / TPOT rows under the client's latency table, and what they are read from."""
    s = summary.server_latency_s
    if s is None:
        return []
    rows = [
        f"| {name} (server) | | {p.count} | " + " | ".join(server_ms(p, k) for k in PERCENTILE_KEYS) + " | |"
        for name, p in (("ttft", s.ttft), ("itl", s.itl), ("tpot", s.tpot))
    ]
    source = (
        f"Rows marked (server): {s.source}; in brackets, the bucket each percentile lies in (ms). They include the "
        "requests a run's operations sent beside the load (docs/load_tests.md#figures)."
    )
    return [*rows, "", source]


def client_cost_line(summary: RunSummary) -> str:
    """The load generator's own cost (its CPU is the server's loss on a shared host), or why it is absent."""
    c = summary.client_cost
    if c is None:
        return "- the client's own cost: not measured in this run"
    lag = c.loop_lag_s
    return (
        f"- the client's own cost: {c.cpu_s:.1f} CPU s ({c.cpu_s_per_request * 1000:.1f} ms per request) in this "
        f"process; its event loop ran late by {_ms(lag.p50)} / {_ms(lag.p99)} ms (p50 / p99; ITL and TPOT are "
        f"withheld over {c.lag_bound_s * 1000:g} ms; the server's own are the (server) rows)"
        + (
            ""
            if c.runqueue_wait_s is None
            else f"; its thread waited {c.runqueue_wait_s:.1f} s runnable for a CPU (the kernel's schedstat)"
        )
    )


def rates_line(cs: ClientServer) -> str:
    """The client's rates beside the engines' own over the same window, flagged when they disagree."""
    flag = (
        ""
        if cs.agrees
        else " **The client's requests/s is outside 5 % of the engines' count: read the client's figures with care.**"
    )
    return (
        f"Over the load's {cs.wall_s:.0f} s: the client {cs.client_requests_per_s:.2f} req/s and "
        f"{cs.client_output_tokens_per_s:.0f} output tokens/s of complete answers; the engines' own counters "
        f"{cs.engine_requests_per_s:.2f} completed req/s and {cs.engine_output_tokens_per_s:.0f} generated "
        f"tokens/s (cancelled and failed requests' tokens included).{flag}"
    )
