"""The report's plots (matplotlib, drawn off-screen): latency CDFs, counters and throughput over time with the
run's events marked, the capacity search, the fuzz sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..load.client import RequestResult
from ..load.fuzz_sweep import layer_grid
from ..load.outcomes import OK_OUTCOMES
from ..observe.counters import SOURCES
from ..observe.monitor import InvariantChecker
from ..results.events import Event
from ..results.models import Capacity


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_latency_cdf(results: list[RequestResult], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ok = [r for r in results if r.outcome == "ok"]
    series = {
        "TTFT (streams)": [r.ttft for r in ok if r.ttft is not None],
        "TPOT (streams)": [r.tpot for r in ok if r.tpot is not None],
        "end-to-end (all)": [r.e2e for r in ok if r.e2e is not None],
    }
    for ax, (name, values) in zip(axes, series.items(), strict=False):
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


def plot_counters(checker: InvariantChecker, path: Path, events: Sequence[Event]) -> None:
    plt = _plt()
    replicas = sorted({k for s in checker.history for k in s.replicas})
    if not replicas:
        return
    fig, axes = plt.subplots(len(replicas), 1, figsize=(10, 2.8 * len(replicas)), squeeze=False)
    for ax, key in zip(axes[:, 0], replicas, strict=False):
        ts: list[float] = []
        total: list[float] = []
        parts: dict[str, list[float]] = {s: [] for s in SOURCES}
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
        for f in events:
            ax.axvline(f.t, color="orange", linestyle="--", alpha=0.8)
        ax.set_title(f"replica {key}" + (" (dead: stale series)" if key in checker.stale else ""))
        ax.set_xlabel("s since start")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_throughput(results: list[RequestResult], path: Path, events: Sequence[Event]) -> None:
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
    for f in events:
        ax.axvline(f.t, color="orange", linestyle="--", label=f.kind)
    ax.set_xlabel("s since start (5 s bins)")
    ax.set_ylabel("requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep(points, path: Path) -> None:
    """Accuracy and divergence against strength at the input embeddings (fuzz_layer 0), one line per mode."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for mode in sorted({p.mode for p in points}):
        pts = [p for p in points if p.mode == mode and p.layer == 0]
        xs = [max(p.strength, 1e-2) for p in pts]
        axes[0].plot(xs, [p.accuracy for p in pts], marker="o", label=mode)
        axes[1].plot(xs, [p.token_divergence for p in pts], marker="o", label=mode)
    for ax, title in zip(axes, ("fixture-task accuracy", "token divergence from s = 0"), strict=False):
        ax.set_xscale("log")
        ax.set_xlabel("fuzz_strength (s = 0 drawn at 0.01)")
        ax.set_title(f"{title}, fuzz_layer 0")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep_layers(points, path: Path) -> None:
    """Task accuracy as a heatmap of depth (fuzz_layer, rows) by strength (columns), one panel per mode."""
    plt = _plt()
    modes = list(dict.fromkeys(p.mode for p in points))
    fig, axes = plt.subplots(1, len(modes), figsize=(6.2 * len(modes), 2.8), squeeze=False)
    image = None
    for ax, mode in zip(axes[0], modes, strict=True):
        layers, strengths, grid = layer_grid(points, mode)
        values = [[float("nan") if a is None else a for a in row] for row in grid]
        image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(strengths)), [f"{s:g}" for s in strengths], rotation=45, fontsize=8)
        ax.set_yticks(range(len(layers)), [str(k) for k in layers])
        ax.set_xlabel("fuzz_strength")
        ax.set_ylabel("fuzz_layer")
        ax.set_title(f"{mode}: task accuracy")
        for i, row in enumerate(values):
            for j, a in enumerate(row):
                if a == a:  # not NaN
                    ax.text(j, i, f"{a:.2f}", ha="center", va="center", fontsize=7, color="white" if a < 0.6 else "k")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.9, label="accuracy")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


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
