"""Write a run's results: per-request JSONL, summary JSON, and a Markdown report with plots.

Files in the output directory:

``requests.jsonl``   one line per request (spec, outcome, timings)
``summary.json``     the numbers and the verdict: a ``load_tests.results.RunSummary`` (schema:
                     docs/summary.schema.json)
``metrics.jsonl``    every monitor scrape, per replica
``report.md``        the human report, with:
``latency_cdf.png``  TTFT / TPOT / E2E CDFs
``counters.png``     prompt-token counters over time, per replica, by source
``throughput.png``   completed requests per second over time
``fuzz_sweep.png``   accuracy and divergence against fuzz strength (when a sweep ran)
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .client import RequestResult
from .counters import SOURCES
from .monitor import InvariantChecker
from .outcomes import OK_OUTCOMES
from .results import Capacity, Fault, Repeats, RunSummary

# The files above that every report writes (a run's other outputs must not take these names).
REPORT_FILES = frozenset({"requests.jsonl", "summary.json", "metrics.jsonl", "report.md", "latency_cdf.png",
                          "counters.png", "throughput.png", "fuzz_sweep.png", "capacity.png"})


def ingress_retries_line(summary: RunSummary) -> str:
    """The refusals at the ingress the client sent again, in one line (the report and the CLI table)."""
    ir = summary.ingress_retries
    return (f"{ir.requests} request(s), {ir.answered} answered on a retry; refusals {ir.refusals} "
            f"(docs/load_tests.md#refused-at-the-ingress)") if ir.requests else "none"


def write_jsonl(path: Path, rows) -> None:
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdf(results: list[RequestResult], path: Path) -> None:
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ok = [r for r in results if r.outcome == "ok"]
    series = {"TTFT (streams)": [r.ttft for r in ok if r.ttft is not None],
              "TPOT (streams)": [r.tpot for r in ok if r.tpot is not None],
              "end-to-end (all)": [r.e2e for r in ok if r.e2e is not None]}
    for ax, (name, values) in zip(axes, series.items()):
        name = f"{name}, {len(values)} requests"
        if values:
            xs = np.sort(np.asarray(values)) * 1000
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs))
        ax.set_title(name)
        ax.set_xlabel("ms")
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_counters(checker: InvariantChecker, path: Path, faults: list[Fault]) -> None:
    plt = _plt()
    replicas = sorted({k for s in checker.history for k in s.replicas})
    if not replicas:
        return
    fig, axes = plt.subplots(len(replicas), 1, figsize=(10, 2.8 * len(replicas)), squeeze=False)
    for ax, key in zip(axes[:, 0], replicas):
        ts, total, parts = [], [], {s: [] for s in SOURCES}
        for snap in checker.history:
            rc = snap.replicas.get(key)
            if rc is None:
                continue
            ts.append(snap.t)
            total.append(rc.prompt_tokens)
            for s in parts:
                parts[s].append(rc.by_source.get(s, 0.0))
        ax.plot(ts, total, color="black", linewidth=2, label="prompt_tokens")
        for s, ys in parts.items():
            ax.plot(ts, ys, label=s)
        for v in checker.violations:
            if v.replica == key:
                ax.axvline(v.t, color="red", linestyle=":", alpha=0.6)
        for f in faults:
            ax.axvline(f.t, color="orange", linestyle="--", alpha=0.8)
        ax.set_title(f"replica {key}" + (" (dead: stale series)" if key in checker.stale else ""))
        ax.set_xlabel("s since start")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_throughput(results: list[RequestResult], path: Path, faults: list[Fault]) -> None:
    import numpy as np

    plt = _plt()
    ends = [r.start + (r.e2e or 0) for r in results if r.outcome == "ok"]
    errs = [r.start + (r.e2e or 0) for r in results if r.outcome not in OK_OUTCOMES]
    if not ends:
        return
    bins = np.arange(0, max(ends + errs) + 5, 5)
    fig, ax = plt.subplots(figsize=(10, 3))
    ax.hist(ends, bins=bins, label="completed", alpha=0.8)
    if errs:
        ax.hist(errs, bins=bins, label="failed", color="red", alpha=0.8)
    for f in faults:
        ax.axvline(f.t, color="orange", linestyle="--", label=f.kind)
    ax.set_xlabel("s since start (5 s bins)")
    ax.set_ylabel("requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep(points, path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for mode in sorted({p.mode for p in points}):
        pts = [p for p in points if p.mode == mode]
        xs = [max(p.strength, 1e-2) for p in pts]
        axes[0].plot(xs, [p.accuracy for p in pts], marker="o", label=mode)
        axes[1].plot(xs, [p.token_divergence for p in pts], marker="o", label=mode)
    for ax, title in zip(axes, ("fixture-task accuracy", "token divergence from s = 0")):
        ax.set_xscale("log")
        ax.set_xlabel("fuzz_strength (s = 0 drawn at 0.01)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def markdown(summary: RunSummary, title: str, sweep=None, images: list[str] = ()) -> str:
    lines = [f"# {title}", ""]
    verdict = "PASSED" if summary.passed else "FAILED"
    lines += [f"**{verdict}**" + ("" if summary.passed else ": " + "; ".join(summary.failures)), ""]
    t = summary.throughput
    lines += ["## Load", "",
              f"{summary.started} requests in {summary.wall_s:.0f} s; outcomes: "
              + ", ".join(f"{k} {v}" for k, v in sorted(summary.outcomes.items())), "",
              f"- throughput: {t.requests_per_s:.2f} req/s ({t.completed} complete answers), "
              f"{t.output_tokens_per_s:.1f} output tokens/s",
              f"- goodput: {t.goodput_requests_per_s:.2f} req/s ({t.slo_met} of the {t.completed} complete answers) "
              f"meeting {summary.slo.model_dump()}: streams on TTFT and TPOT, the rest on end-to-end time "
              f"(docs/load_tests.md#figures)", "",
              "| latency (ms) | requests | values | p50 | p90 | p95 | p99 | mean |",
              "|---|---|---|---|---|---|---|---|"]
    for name, p in summary.latency_s:
        lines.append(f"| {name} | {p.requests} | {p.count} | {_ms(p.p50)} | {_ms(p.p90)} | {_ms(p.p95)} | "
                     f"{_ms(p.p99)} | {_ms(p.mean)} |")
    faults = [{"kind": f.kind, "t": f.t, "detail": f.detail} for f in summary.faults]
    lines += ["", "## Errors", "",
              f"- unexpected, by kind: {summary.errors_by_kind or 'none'}",
              f"- unexpected, most common messages: {summary.errors_by_message or 'none'}",
              f"- explained by injected faults: {summary.errors_explained_by_faults or 'none'}",
              f"- refused at the ingress and sent again: {ingress_retries_line(summary)}",
              f"- bad requests sent {summary.bad_requests.sent}, refused naming the field "
              f"{summary.bad_requests.rejected_naming_the_field}",
              f"- faults injected: {faults or 'none'}", ""]
    if summary.first_unexpected_errors:
        lines += ["First unexpected error:", "", "```json",
                  json.dumps(summary.first_unexpected_errors[0], indent=1)[:3000], "```", ""]
    if summary.planned_faults:
        lines += ["## Planned faults", "", "| fault | fired | shown | evidence | problems |", "|---|---|---|---|---|"]
        lines += [f"| {c.fault} | {c.fired} | {'yes' if c.ok else '**no**'} | {c.evidence} | "
                  f"{'; '.join(c.problems) or '-'} |" for c in summary.planned_faults]
        lines.append("")
    lines += [f"Replicas that died without the run killing them: {summary.unexpected_replica_deaths or 'none'}", ""]
    if summary.capacity:
        lines += capacity_lines(summary.capacity)
    if summary.repeats:
        lines += repeats_lines(summary.repeats)
    if summary.probes:
        p = summary.probes
        lines += ["## Greedy probes under faults vs the fault-free deployment", "",
                  f"{p.rounds} rounds, {p.sent} probes sent, {p.compared} answered and compared, "
                  f"{p.equal} equal to the fault-free answer, {p.failed} failed (judged with the other "
                  f"requests); problems: {'; '.join(p.problems) or 'none'}", ""]
    inv = summary.invariants
    lines += ["## Counter invariants", "",
              f"{inv.scrapes} scrapes (scrape time p50 {_ms(inv.scrape_seconds.p50)} ms, max "
              f"{_ms(inv.scrape_seconds.p99)} ms; failed scrapes {inv.failed_scrapes}); violations: {inv.violations} {inv.by_kind or ''}; "
              f"accounting violations expected from injected faults: {inv.expected_accounting_violations or 'none'}", ""]
    if inv.first_violation:
        lines += ["First violation, full context:", "", "```json",
                  json.dumps(asdict(inv.first_violation), indent=1, default=str)[:4000], "```", ""]
    lines += ["| replica | node | stale | prompt_tokens | local_compute | local_cache_hit | external_kv_transfer "
              "| finished | violations | corrections |", "|---|---|---|---|---|---|---|---|---|---|"]
    for k, r in sorted(summary.replicas.items()):
        bs = r.by_source
        lines.append(f"| {k} | {r.node} | {r.stale} | {r.prompt_tokens:g} | {bs.get('local_compute', 0):g} | "
                     f"{bs.get('local_cache_hit', 0):g} | {bs.get('external_kv_transfer', 0):g} | "
                     f"{sum(r.requests_finished.values()):g} | {r.violations or 0} | {r.corrections or 0} |")
    cs = summary.client_server
    lines += ["", f"Client/server: clients got {cs.client_ok} complete answers and cancelled {cs.client_cancelled}; "
              f"engines completed {cs.engine_completed:g} and finished {cs.engine_finished:g} in all "
              f"({cs.sent_past_router} requests got past the router). {cs.note or ''}", ""]
    if sweep:
        lines += ["## Fuzz sweep (greedy, through the deployment)", "",
                  "| mode | fuzz_strength | accuracy | outputs changed | token divergence |", "|---|---|---|---|---|"]
        lines += [f"| {p.mode} | {p.strength:g} | {p.accuracy:.2f} | {p.changed_outputs:.2f} | {p.token_divergence:.2f} |"
                  for p in sweep]
        lines.append("")
    lines += ["## Plots", ""] + [f"![{img}]({img})" for img in images]
    return "\n".join(lines) + "\n"


def capacity_lines(cap: Capacity) -> list[str]:
    knee = "none: no step met the SLO" if cap.knee is None else (
        f"**{cap.knee} in flight**, {cap.knee_goodput_requests_per_s:.2f} req/s goodput")
    plan = cap.plan
    lines = ["## Capacity search (profile sweep)", "",
             f"Steps of {plan.step_s:g} s at 1, 2, 4, ... in flight. Knee (the highest load whose goodput is within "
             f"{plan.knee_within:.0%} of the best, {cap.best_goodput_requests_per_s:.2f} req/s, and at which at least "
             f"{plan.slo_attainment:.0%} of the complete answers met the SLO, with no invariant violation and at most "
             f"{plan.error_budget:.0%} failures): {knee}. Stopped: {cap.stopped_because}.", "",
             "| in flight | requests | req/s | goodput | SLO met | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | "
             "failures | violations | meets SLO |", "|---|---|---|---|---|---|---|---|---|---|"]
    for st in cap.steps:
        t, lat = st.throughput, st.latency_s
        met = "-" if st.slo_attainment is None else f"{st.slo_attainment:.0%}"
        lines.append(f"| {st.concurrency} | {st.started} | {t.requests_per_s:.2f} | {t.goodput_requests_per_s:.2f} | "
                     f"{met} | {_ms(lat.ttft.p50)} / {_ms(lat.ttft.p99)} ({lat.ttft.requests}) | "
                     f"{_ms(lat.tpot.p50)} / {_ms(lat.tpot.p99)} ({lat.tpot.requests}) | {st.unexpected_failures} | "
                     f"{st.violations} {' '.join(st.violation_kinds)} | {'yes' if st.meets_slo else 'no'} |")
    return lines + [""]


def repeats_lines(rep: Repeats) -> list[str]:
    def fmt(name: str, v: float | None) -> str:
        if v is None:
            return "-"
        return f"{v * 1000:.0f} ms" if name.endswith("_s") else f"{v:.2f}"

    lines = [f"## {rep.runs} runs ({rep.passed} passed)", "",
             "| figure | median | min | max | spread | each run |", "|---|---|---|---|---|---|"]
    for name, sp in rep.figures.items():
        spread = "-" if sp.relative_spread is None else f"{sp.relative_spread:.0%}"
        lines.append(f"| {name} | {fmt(name, sp.median)} | {fmt(name, sp.min)} | {fmt(name, sp.max)} | {spread} | "
                     + ", ".join(fmt(name, v) for v in sp.values) + " |")
    return lines + ["", "Each run's report: " + ", ".join(f"[{Path(d).name}]({Path(d).name}/report.md)"
                                                          for d in rep.reports), ""]


def plot_capacity(cap: Capacity, path: Path) -> None:
    plt = _plt()
    xs = [st.concurrency for st in cap.steps]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8))
    left.plot(xs, [st.throughput.requests_per_s for st in cap.steps], "o-", label="throughput")
    left.plot(xs, [st.throughput.goodput_requests_per_s for st in cap.steps], "s--", label="SLO goodput")
    left.set_ylabel("requests / s")
    p99 = [(st.concurrency, st.latency_s.ttft.p99 * 1000) for st in cap.steps if st.latency_s.ttft.p99 is not None]
    right.plot([x for x, _ in p99], [y for _, y in p99], "o-", color="tab:red", label="TTFT p99")
    right.set_ylabel("ms")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("requests in flight")
        if cap.knee is not None:
            ax.axvline(cap.knee, color="grey", linestyle=":", label=f"knee ({cap.knee})")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("capacity search: throughput and goodput (left), TTFT p99 (right) against load")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, title: str, results: list[RequestResult], summary: RunSummary,
                 checker: InvariantChecker, sweep=None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "requests.jsonl", (r.to_json() for r in results))
    write_jsonl(out / "metrics.jsonl", ({"t": s.t, "replicas": {k: asdict(rc) for k, rc in s.replicas.items()},
                                         "errors": s.errors, "duplicates": s.duplicates}
                                        for s in checker.history))
    (out / "summary.json").write_text(summary.model_dump_json(indent=2))
    images = []
    plot_latency_cdf(results, out / "latency_cdf.png")
    images.append("latency_cdf.png")
    plot_throughput(results, out / "throughput.png", summary.faults)
    if (out / "throughput.png").exists():
        images.append("throughput.png")
    plot_counters(checker, out / "counters.png", summary.faults)
    if (out / "counters.png").exists():
        images.append("counters.png")
    if summary.capacity and summary.capacity.steps:
        plot_capacity(summary.capacity, out / "capacity.png")
        images.append("capacity.png")
    if sweep:
        (out / "fuzz_sweep.json").write_text(json.dumps([asdict(p) for p in sweep], indent=2))
        plot_sweep(sweep, out / "fuzz_sweep.png")
        images.append("fuzz_sweep.png")
    path = out / "report.md"
    path.write_text(markdown(summary, title, sweep, images))
    return path
