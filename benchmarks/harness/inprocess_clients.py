"""The two clients :mod:`benchmarks.bench_agreement` compares, each called in this process with its CPU counted.

``theirs`` is vLLM's ``vllm bench serve`` (:mod:`benchmarks.harness.vllm_bench_serve`:
vLLM's own parser and ``vllm.benchmarks.serve.main``), ``ours`` the
stress-test CLI's load run (:func:`load_tests.runner.run.run` with the inputs
``python -m load_tests --scenario bench --prompts-file ...`` runs with). Both
run in the caller's process so that each one's client CPU is this process's
CPU over its call alone (:func:`on_cpu`: ``getrusage(RUSAGE_SELF)``, every
thread, the heap from before the call frozen so that neither's garbage
collector walks the other's modules), start-up excluded for both
(:func:`start_clients`, before any measured run). Shared with
:mod:`benchmarks.knee_agreement`.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import os
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from benchmarks.harness import vllm_bench_serve
from benchmarks.harness.arms import MODEL_NAME
from load_tests import cli as load_cli
from load_tests.runner.run import run as load_run

log = logging.getLogger("fuzzserve.benchmarks.inprocess_clients")
T = TypeVar("T")


def save_tokenizer(out: Path) -> Path:
    """The fixture tokenizer (built from code, nothing trained) in ``out``: vLLM's client counts prompt tokens."""
    from fixture_model.build import build_tokenizer

    build_tokenizer().save_pretrained(out)
    return out


def theirs(
    url: str,
    tokenizer: Path,
    concurrency: int,
    prompts: Path,
    requests: int,
    output_len: int,
    work: Path,
    api_key: str | None,
) -> dict[str, Any]:
    """``vllm bench serve``'s figures (its own result, seconds) over the prompts of a ``custom`` dataset file, run
    in this process (:mod:`benchmarks.harness.vllm_bench_serve`); what it prints is kept out of this command's
    output."""
    args = vllm_bench_serve.parse_args(
        vllm_bench_serve.bench_flags(
            url, MODEL_NAME, tokenizer, concurrency, prompts, requests, output_len, work, "vllm_bench.json"
        )
    )
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), openai_api_key(api_key):
            res, cpu = on_cpu(lambda: vllm_bench_serve.run(args))
    except Exception:
        log.error("vllm bench serve failed; it printed:\n%s", printed.getvalue()[-3000:])
        raise
    return {
        "tool": "vllm bench serve",
        "requests": res["completed"],
        "failed": res.get("failed", 0),
        "requests_per_s": res["request_throughput"],
        "ttft_p50_s": res["median_ttft_ms"] / 1000,
        "tpot_p50_s": res["median_tpot_ms"] / 1000,
        "ttft_p99_s": res["p99_ttft_ms"] / 1000,
        "client_cpu_s": cpu,
    }


def ours(
    url: str,
    concurrency: int,
    prompts: Path,
    requests: int,
    output_len: int,
    work: Path,
    api_key: str | None,
    metrics_urls: list[str],
    quick_settle: bool = False,
    scrape_interval_s: float | None = None,
) -> dict[str, Any]:
    """The stress-test CLI's figures: :func:`load_tests.runner.run.run` in this process with the inputs of
    ``python -m load_tests --scenario bench --prompts-file ...`` (the CLI's parser and builders), its typed
    :class:`~load_tests.results.models.RunSummary`. Its console lines go to stderr; its report to ``work/ours``."""
    mix = {"max_tokens": [output_len, output_len]}
    argv = [
        "--scenario",
        "bench",
        "--url",
        url,
        "--concurrency",
        str(concurrency),
        "--requests",
        str(requests),
        "--prompts-file",
        str(prompts),
        "--mix",
        json.dumps(mix),
        "--no-sweep",
        "--no-progress",
        "--out",
        str(work / "ours"),
        *(a for m in metrics_urls for a in ("--metrics-url", m)),
    ]
    if api_key:
        argv += ["--api-key", api_key]
    if scrape_interval_s is not None:
        argv += ["--scrape-interval", str(scrape_interval_s)]
    if quick_settle:  # the echo server's counters are exact at once: no metrics export interval to wait out
        argv += ["--scrape-interval", "0.3", "--settle-interval", "0.3", "--settle-timeout", "3"]
    inputs = load_cli.inputs_for(argv)
    console = Console(stderr=True)
    s, cpu = on_cpu(lambda: load_run(*inputs, console))
    lat, tp = s.latency_s, s.throughput
    return {
        "tool": "python -m load_tests",
        "requests": tp.completed,
        "passed": s.passed,
        "failures": s.failures,
        "requests_per_s": tp.requests_per_s,
        "ttft_p50_s": lat.ttft.p50,
        "tpot_p50_s": lat.tpot.p50,
        "ttft_p99_s": lat.ttft.p99,
        "tpot_note": lat.tpot.note,
        "ttft_requests": lat.ttft.requests,
        "client_cpu_s": cpu,
        "loop_lag_p99_s": s.client_cost.loop_lag_s.p99 if s.client_cost else None,
        "runqueue_wait_s": s.client_cost.runqueue_wait_s if s.client_cost else None,
    }


def start_clients() -> None:
    """Both clients' start-up, before any measured run, so that no run pays it: vLLM's benchmark imported (vLLM
    with it, some 10 s of CPU), and the plotting library our report imports at its first plot (off-screen, as
    :mod:`load_tests.report.plots` draws)."""
    vllm_bench_serve.parse_args([])
    import matplotlib  # the report's own lazy import, done here ahead of the first run

    matplotlib.use("Agg")
    import matplotlib.pyplot


def on_cpu(call: Callable[[], T]) -> tuple[T, float]:
    """``call()`` and the CPU seconds (user + system) this process spent in it, every thread counted
    (``RUSAGE_SELF``). The heap that exists before the call is frozen for it (``gc.freeze``) and released after:
    the two clients share this process, and neither's garbage collector should walk the other's modules."""
    gc.collect()
    gc.freeze()
    before = _self_cpu_s()
    try:
        result = call()
    finally:
        cpu = _self_cpu_s() - before
        gc.unfreeze()
    return result, cpu


def _self_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@contextlib.contextmanager
def openai_api_key(key: str | None) -> Iterator[None]:
    """``OPENAI_API_KEY`` set to ``key`` while vLLM's client runs (it reads its key there as it sends), restored
    after; ``None`` leaves the environment as it is."""
    if key is None:
        yield
        return
    old = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = key
    try:
        yield
    finally:
        if old is None:
            del os.environ["OPENAI_API_KEY"]
        else:
            os.environ["OPENAI_API_KEY"] = old
