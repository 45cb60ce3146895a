"""The headline benchmark's results as files: ``vs_vllm.json``, ``vs_vllm.md`` (the tables) and ``vs_vllm.png``.

What is written is what :mod:`benchmarks.harness.comparison` computed from the
runs that count; nothing is judged here. The markdown is one table per
question, in the order a reader asks them: the goals and their verdicts, each
arm's own figures, the pair ratios (the host-speed marker beside them), the
cache tiers' hits, where the time to first token went, then every run with
its counters and why it is void. :func:`write_results` rewrites the JSON and
the markdown after every phase, so that a stopped run keeps its data
(``--resume`` reads the JSON back: :mod:`benchmarks.harness.resume`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.harness import pair_stats
from benchmarks.harness.arms import ARMS
from benchmarks.harness.comparison import (
    FIGURES,
    SPEED_MARKER_TITLE,
    SPLIT_PARTS,
    Comparison,
    arm_figures,
    compare,
    goals,
    hits_by_arm,
    ttft_split,
)
from benchmarks.harness.runs import Meta, Run


def _ci(fig: pair_stats.PairRatio) -> str:
    return f"{fig['median']:.2f}x [{fig['ci90'][0]:.2f}, {fig['ci90'][1]:.2f}]"


def _f(v: float | None, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v * scale, fmt)


def _header(meta: Meta) -> list[str]:
    """The title, the command, the host, the sittings of a resumed run, the workload, and why it is below
    protocol."""
    lines = [
        f"# {meta['workload']['name']} workload: {', '.join(meta['workload']['arms'])} ({meta['date']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Host: {meta['machine']}.",
        "",
        *(
            [f"Sittings (a stopped run resumed): {', '.join(meta['sittings'])}.", ""]
            if len(meta.get("sittings", [])) > 1
            else []
        ),
        f"Workload: {json.dumps(meta['workload'])}.",
        "",
    ]
    if meta.get("below_protocol"):
        lines += [f"**Below protocol**: {meta['below_protocol']}", ""]
    return lines


def _goals_table(ratios: dict[str, dict[str, Comparison]]) -> list[str]:
    """Each goal at each run label with its verdict; nothing where no goal's two arms ran."""
    rows = goals(ratios)
    if not rows:
        return []
    return [
        (
            f"Goals (met: the median on the goal's side and the whole 90 % interval within "
            f"{pair_stats.GOAL_MARGIN:g} of the goal; anything else: not met):"
        ),
        "",
        "| run | goal | ratio [90 % interval] | pairs | verdict |",
        "|---|---|---|---|---|",
        *(
            f"| {g['run']} | {g['goal']} | {g['median']:.2f}x [{g['ci90'][0]:.2f}, {g['ci90'][1]:.2f}] | "
            f"{g['pairs']} | **{g['verdict']}** |"
            for g in rows
        ),
        "",
    ]


def _arms_table(runs: list[Run]) -> list[str]:
    """Each arm's own figures, absolute (so that hosts compare), with its valid and void runs."""
    lines = [
        (
            "Each arm's own figures (the median over its valid runs; busy cores: host CPU seconds over the "
            "client's window, /proc/stat; void: runs that count nowhere):"
        ),
        "",
        (
            "| run | arm | req/s | TTFT p50 ms | TTFT p99 ms | latency p50 ms | host CPU ms/request | busy cores "
            "| runs | void |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, arms in arm_figures(runs).items():
        for arm, f in arms.items():
            lines.append(
                f"| {label} | {arm} | {_f(f['req_per_s'])} | {_f(f['ttft_p50'])} | {_f(f['ttft_p99'])} | "
                f"{_f(f['e2el_p50'])} | {_f(f['host_cpu_s_per_request'], 1000)} | "
                f"{_f(f['host_busy_cores'], fmt='.2f')} | {f['runs']} | {f['void']} |"
            )
    return [*lines, ""]


def _ratios_table(ratios: dict[str, dict[str, Comparison]]) -> list[str]:
    """Each arm pair's figures as pair ratios with their intervals, the host-speed marker last."""
    lines = [
        "Each cell: the median over pairs of the ratio candidate / reference, [bootstrap 90 % interval].",
        "",
        "| run | arms | pairs | requests (ref / cand) | " + " | ".join(FIGURES.values()) + f" | {SPEED_MARKER_TITLE} |",
        "|---|---|---|---|" + "---|" * (len(FIGURES) + 1),
    ]
    for label, comps in ratios.items():
        for name, comp in comps.items():
            ref, cand = comp["reference"], comp["candidate"]
            figs = comp["figures"]
            lines.append(
                f"| {label} | {name} | {figs['req_per_s']['pairs']} | {comp['requests'][ref]} / "
                f"{comp['requests'][cand]} ({comp['failed'][ref]} / {comp['failed'][cand]} failed) | "
                + " | ".join(_ci(figs[f]) for f in FIGURES)
                + f" | {_ci(marker) if (marker := comp.get('speed_marker')) else '-'} |"
            )
    return [*lines, ""]


def _hits_table(runs: list[Run]) -> list[str]:
    """The prompt tokens each cache tier served, per arm, by the servers' own counters."""
    lines = [
        "Prompt tokens served from cache, per arm (summed over its runs; the servers' own counters):",
        "",
        (
            "| run | arm | requests | prompt tokens | local prefix cache hits | offload tier hits | "
            "offload hits per request |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for label, hits in hits_by_arm(runs).items():
        for arm, h in hits.items():
            per = h["external_hits"] / h["requests"] if h["requests"] else 0.0
            lines.append(
                f"| {label} | {arm} | {h['requests']:.0f} | {h['prompt_tokens']:.0f} | "
                f"{h['prefix_cache_hits']:.0f} | {h['external_hits']:.0f} | {per:.1f} |"
            )
    return [*lines, ""]


def _split_table(runs: list[Run]) -> list[str]:
    """Where each arm's time to first token went (:func:`benchmarks.harness.comparison.ttft_split`)."""
    lines = [
        (
            "Where the time to first token goes, per arm (ms; each part the median over the arm's runs of the "
            "run's mean; `server`, `queue`, `prefill` from the server's own histograms, `outside` = client - "
            "server: HTTP, parsing, guard, HAProxy and Ray's streaming; `hand-offs` = server - queue - prefill: "
            "frontend to EngineCore and back):"
        ),
        "",
        "| run | arm | client TTFT | server TTFT | queue | prefill | outside | hand-offs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, splits in ttft_split(runs).items():
        for arm, part in splits.items():
            lines.append(f"| {label} | {arm} | " + " | ".join(_f(part[k]) for k in SPLIT_PARTS) + " |")
    return [*lines, ""]


def _runs_table(runs: list[Run]) -> list[str]:
    """Every run, void ones included, with its counters, CPU per role and why it is void."""
    lines = [
        (
            "Every run (vLLM's `bench serve` figures; host CPU from /proc/stat over the client's measured "
            "window, steal apart: *stolen cores* is what the hypervisor took, a host-speed marker; cache hits "
            "from the server):"
        ),
        "",
        (
            "| pair | arm | run | conc. | completed | failed | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | "
            "host CPU ms/request | busy cores | stolen cores | hits local / offload | void | CPU ms/request by role | "
            "waited for a core ms/request by role |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        roles = ", ".join(f"{k} {v:.1f}" for k, v in r.roles_ms_per_request.items())
        waits = ", ".join(f"{k} {v:.1f}" for k, v in r.roles_wait_ms_per_request.items()) or "-"
        c = r.counters
        lines.append(
            f"| {r.pair} | {r.stack} | {r.label} | {r.concurrency} | {r.completed} | {r.failed} | "
            f"{r.req_per_s:.1f} | {r.ttft_ms['p50']:.0f} / {r.ttft_ms['p99']:.0f} | "
            f"{r.tpot_ms['p50']:.1f} / {r.tpot_ms['p99']:.1f} | {1000 * r.host_cpu_s_per_request:.1f} | "
            f"{r.host_busy_cores:.2f} | {'-' if r.host_steal_cores is None else format(r.host_steal_cores, '.2f')} | "
            f"{c.get('prefix_cache_hits', 0):.0f} / {c.get('external_hits', 0):.0f} "
            f"| {r.void or ''} | {roles} | {waits} |"
        )
    return [*lines, ""]


def markdown(meta: Meta, runs: list[Run], ratios: dict[str, dict[str, Comparison]]) -> str:
    """``vs_vllm.md``: every table of the run, then the protocol checks as they passed."""
    lines = [
        *_header(meta),
        *_goals_table(ratios),
        *_arms_table(runs),
        *_ratios_table(ratios),
        *_hits_table(runs),
        *_split_table(runs),
        *_runs_table(runs),
        "Protocol: " + "; ".join(meta["protocol"]),
        "",
    ]
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    """``vs_vllm.png``: requests/s, TTFT p50 and host CPU per request of every valid run, by label and arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r.label for r in runs))
    arms = list(dict.fromkeys(r.stack for r in runs))
    colors = dict(
        zip(ARMS, ("tab:blue", "tab:orange", "tab:green", "tab:brown", "tab:red", "tab:purple"), strict=False)
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (metric, label, scale) in zip(
        axes,
        (
            ("req_per_s", "requests/s", 1),
            ("ttft_p50", "TTFT p50 ms", 1),
            ("host_cpu_s_per_request", "host CPU ms per request", 1000),
        ),
        strict=False,
    ):
        for k, arm in enumerate(arms):
            for i, lab in enumerate(labels):
                ys = [r.figure(metric) * scale for r in runs if r.stack == arm and r.label == lab and r.void is None]
                xs = [i + (k - (len(arms) - 1) / 2) * 0.15] * len(ys)
                ax.scatter(xs, ys, color=colors.get(arm), label=arm if i == 0 else None, s=14)
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("vLLM bench serve, each run: " + ", ".join(arms))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_results(out: Path, meta: Meta, runs: list[Run]) -> None:
    """vs_vllm.json and vs_vllm.md as they stand (rewritten after every phase: a stopped run keeps its data)."""
    ratios = compare(runs)
    (out / "vs_vllm.json").write_text(
        json.dumps(
            {
                "meta": meta,
                "ratios": ratios,
                "goals": goals(ratios),
                "arms": arm_figures(runs),
                "ttft_split": ttft_split(runs),
                "runs": [asdict(r) for r in runs],
            },
            indent=1,
        )
    )
    (out / "vs_vllm.md").write_text(markdown(meta, runs, ratios))
