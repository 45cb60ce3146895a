"""GuideLLM as an outside client of the agreement check and the capacity search (issue 47), in an environment of
its own.

GuideLLM pins its own torch, transformers and datasets, which the project's environment (vLLM's pins) must not
take, so the benchmark builds ``.cache/guidellm-venv`` on first use (:func:`ensure_env`: ``pip install
torch==2.13.0 guidellm==VERSION``, torch first so that pip takes the CPU wheel on this machine's disk instead of a
CUDA build) and runs ``guidellm`` there as a child process. The project's install never installs it.

What is sent: the prompts of a :class:`benchmarks.harness.prompts.PromptSet` as GuideLLM's ``json_file`` dataset,
each row with ``output_tokens_count``, which GuideLLM's completions handler sends as ``max_tokens`` with ``ignore_eos``;
streamed ``/v1/completions``, ``--profile kind=concurrent,streams=N``, a request-count constraint, no warm-up or
cool-down (its defaults: every request counts). What it divides by (:data:`DIVIDES_BY`): its successful requests
over its benchmark's window (``start_time``: the first request sent, ``end_time``: the last completion), as its
``requests_per_second.successful.mean`` reports. Its ITL is vLLM's TPOT ((last token - first token) / (tokens -
1)); its TPOT counts the first token's wait too, so the TPOT compared is its ITL.

Its CPU is its process tree's (``RUSAGE_CHILDREN`` over the call), start-up included (importing torch and
transformers): shown beside the others' and named so, never subtracted.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from serve_app.engine.engine_env import HF_HUB_OFFLINE

log = logging.getLogger("fuzzserve.benchmarks.guidellm_client")
REPO = Path(__file__).resolve().parents[2]
VERSION = "0.8.1"
TORCH = "torch==2.13.0"  # the CPU wheel pip finds on this machine's disk (the project's own pin)
ENV = REPO / ".cache" / "guidellm-venv"
DIVIDES_BY = "successful requests / its benchmark's window: the first request sent to the last completion"
# no model hub: the engines' own switch (serve_app.engine.engine_env), and the datasets and transformers libraries' own
OFFLINE = {HF_HUB_OFFLINE: "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def guidellm_bin(env: Path = ENV) -> Path:
    return env / "bin" / "guidellm"


def installed_version(env: Path = ENV) -> str | None:
    """The GuideLLM version in ``env``, or None where it has none."""
    py = env / "bin" / "python"
    if not py.exists():
        return None
    got = subprocess.run(
        [str(py), "-c", "import importlib.metadata as m; print(m.version('guidellm'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return got.stdout.strip() if got.returncode == 0 else None


def ensure_env(env: Path = ENV) -> Path:
    """``env`` with GuideLLM :data:`VERSION` in it, built (or rebuilt) when it has another or none; its binary."""
    if installed_version(env) != VERSION:
        log.info(
            "building GuideLLM %s's environment in %s (torch from this machine's disk; a few minutes)", VERSION, env
        )
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        pip = [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, f"guidellm=={VERSION}"], check=True)
        if installed_version(env) != VERSION:
            raise RuntimeError(f"GuideLLM {VERSION} did not install into {env}")
    return guidellm_bin(env)


def write_dataset(prompts: Sequence[str], output_len: int, path: Path) -> Path:
    """GuideLLM's ``json_file`` rows: the prompt and the output tokens it asks for (``max_tokens``, ``ignore_eos``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": p, "output_tokens_count": output_len}) + "\n" for p in prompts))
    return path


def concurrent(streams: int) -> dict[str, Any]:
    """GuideLLM's profile of ``streams`` requests in flight."""
    return {"kind": "concurrent", "streams": streams}


def knee(streams: list[int]) -> dict[str, Any]:
    """GuideLLM's knee profile over ``streams`` (at least five, increasing): its own knee detection, no adaptive
    refinement, so that both tools step through the same concurrencies."""
    return {"kind": "knee", "initial_streams": streams}


def command(
    url: str,
    dataset: Path,
    tokenizer: Path,
    profile: dict[str, Any],
    constraint: dict[str, Any],
    out: Path,
    model: str = "fixture",
    binary: Path | None = None,
) -> list[str]:
    """The ``guidellm run`` command line: streamed ``/v1/completions`` from ``dataset`` under ``profile``, each of
    its benchmarks bounded by ``constraint`` (``{"kind": "max_requests", "count": n}`` or ``{"kind":
    "max_duration", "seconds": s}``), its JSON report to ``out``."""
    backend = {
        "kind": "openai_http",
        "target": url,
        "model": model,
        "request_format": "/v1/completions",
        "stream": True,
    }
    return [
        str(binary or guidellm_bin()),
        "run",
        "--backend",
        json.dumps(backend),
        "--data",
        json.dumps({"kind": "json_file", "path": str(dataset)}),
        "--tokenizer",
        json.dumps({"kind": "huggingface_auto", "model": str(tokenizer)}),
        "--profile",
        json.dumps(profile),
        "--constraint",
        json.dumps(constraint),
        "--output",
        json.dumps({"kind": "json", "path": str(out)}),
        "--disable-console-interactive",
    ]


def ms_to_s(metrics: dict[str, Any], name: str, p: str = "p50") -> float | None:
    """A GuideLLM percentile (ms) of the successful requests, in seconds."""
    v = metrics.get(name, {}).get("successful", {}).get("percentiles", {}).get(p)
    return None if v is None else v / 1000


def figures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per benchmark of GuideLLM's JSON report: its concurrency and figures, in seconds (GuideLLM's are ms)."""
    out = []
    for b in report["benchmarks"]:
        m = b["metrics"]

        ttft = ms_to_s(m, "time_to_first_token_ms")
        # GuideLLM times its first token by text: on answers whose tokens decode to empty text (a fuzzed greedy
        # answer, the echo server's) it reads 0; such a figure is withheld, never reported as 0 ms
        timed = bool(ttft)
        out.append(
            {
                "tool": f"guidellm {VERSION}",
                "streams": b.get("config", {}).get("strategy", {}).get("streams"),
                "requests": int(m["request_totals"]["successful"]),
                "failed": int(m["request_totals"].get("errored", 0)),
                "requests_per_s": m["requests_per_second"]["successful"]["mean"],
                "window_s": b["end_time"] - b["start_time"],
                "ttft_p50_s": ttft if timed else None,
                "tpot_p50_s": ms_to_s(m, "inter_token_latency_ms") if timed else None,  # vLLM's TPOT (module doc)
                "ttft_p99_s": ms_to_s(m, "time_to_first_token_ms", "p99") if timed else None,
                **({} if timed else {"latency_note": "withheld: GuideLLM timed no first token (0 ms: empty text)"}),
            }
        )
    return out


def knee_found(report: dict[str, Any]) -> dict[str, Any] | None:
    """The knee profile's final throughput analysis (``status``, ``knee``, ``saturation_concurrency``,
    ``reason``), or None where the report has none."""
    for c in report.get("conclusions", []):
        if c.get("kind") == "knee_detection":
            return dict(c["final"]["throughput"])
    return None


def run_report(
    url: str,
    dataset: Path,
    tokenizer: Path,
    profile: dict[str, Any],
    constraint: dict[str, Any],
    work: Path,
    api_key: str | None = None,
    binary: Path | None = None,
) -> tuple[dict[str, Any], float]:
    """GuideLLM's JSON report of one ``guidellm run``, and its process tree's CPU seconds (start-up included)."""
    out = work / "guidellm.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, **OFFLINE, "GUIDELLM__MAX_WORKER_PROCESSES": "2"}
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        command(url, dataset, tokenizer, profile, constraint, out, binary=binary),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm failed ({done.returncode}): {(done.stderr or done.stdout)[-3000:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return json.loads(out.read_text()), cpu


def run(
    url: str,
    dataset: Path,
    tokenizer: Path,
    streams: int,
    requests: int,
    work: Path,
    api_key: str | None = None,
    binary: Path | None = None,
) -> dict[str, Any]:
    """GuideLLM's figures for ``requests`` requests at ``streams`` in flight, with its process tree's CPU over the
    call (``client_cpu_s``, start-up included)."""
    report, cpu = run_report(
        url, dataset, tokenizer, concurrent(streams), {"kind": "max_requests", "count": requests}, work, api_key, binary
    )
    row = figures(report)[0]
    row["client_cpu_s"] = cpu
    row["client_cpu_note"] = "its process tree's, start-up included"
    return row
