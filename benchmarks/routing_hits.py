r"""Does fuzz-aware routing keep the KV-cache hits a single replica would have? Prefix-cache + offload hit rates.

    python -m benchmarks.routing_hits [--requests 240] [--concurrency 8] [--kv-blocks 48] [--out docs/benchmarks]

Workload, the same prompts for every target: ``--groups`` shared prefixes
(``--prefix-tokens`` tokens each, several 128-token KV blocks) times
``--salts`` fuzz settings (s = 0, scale and gaussian modes, two gaussian
seeds: each its own KV cache salt in the engine), a unique suffix per
request, greedy, in a seeded random order with ``--concurrency`` in flight.
A request can reuse KV only from an earlier request with the same prefix
*and* the same fuzz setting, on the same replica.

Targets, each ``serve_config.yaml`` as shipped with only the named
changes, deployed side by side in one cluster and driven one after another
(hit rates depend on where requests land, not on speed):

====  =================================================================
R1    1 replica (the reference: every repeat can hit)
Rf    2 replicas, ``routing: fuzz_affinity`` (what ships)
Rk    2 replicas, ``routing: prefix_affinity`` (Ray's, keyed on the prompt alone)
Rp    2 replicas, ``routing: power_of_two`` (the control: load only)
====  =================================================================

``--kv-blocks`` shrinks each replica's KV pool (``num_gpu_blocks_override``)
so that prefixes are evicted to the offload tier and loaded back, as under
the stress scenario. The hit rate of a target is, over its replicas,
(``local_cache_hit`` + ``external_kv_transfer``) / ``prompt_tokens`` of the
run (vLLM's ``prompt_tokens_by_source``, read from Ray's metrics export
before and after, at quiescence). Results: ``routing_hits.json`` and
``routing_hits.md`` in ``--out``. A benchmark: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.targets import benchmark_config, to_document_app
from load_tests.command_logs import command_logging
from serve_app.config.deploy_config import Application
from serve_app.config.names import ENGINE_DEPLOYMENT_PREFIX, replica_class_prefix, replica_id
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.routing_hits")

REPO = Path(__file__).resolve().parents[1]
TARGETS = {  # name -> (label, builder-argument overrides of serve_config.yaml, replicas)
    "R1": ("1 replica", {}, 1),
    "Rf": ("2 replicas, fuzz_affinity (shipped)", {"routing": "fuzz_affinity"}, 2),
    "Rk": ("2 replicas, prefix_affinity (prompt only)", {"routing": "prefix_affinity"}, 2),
    "Rp": ("2 replicas, power_of_two (control)", {"routing": "power_of_two"}, 2),
    "Rb": ("2 replicas, fuzz_affinity, imbalanced_threshold 4", {"routing": "fuzz_affinity"}, 2),
}
ROUTER_KWARGS = {"Rb": {"imbalanced_threshold": 4}}  # name -> the request router's kwargs, where not the default
DEFAULT_TARGETS = ("R1", "Rf", "Rk", "Rp")
SALTS: tuple[dict[str, float | str | int], ...] = (
    {},
    {"fuzz_strength": 0.5},
    {"fuzz_strength": 0.5, "fuzz_mode": "gaussian", "fuzz_seed": 1},
    {"fuzz_strength": 0.5, "fuzz_mode": "gaussian", "fuzz_seed": 2},
)
CACHED = ("local_cache_hit", "external_kv_transfer")


def workload(
    n: int, groups: int, salts: int, prefix_tokens: int, suffix_tokens: int, seed: int = 0
) -> list[dict[str, Any]]:
    """``n`` request bodies: (prefix group x fuzz setting) pairs in a seeded random order, unique suffixes."""
    from fixture_model.tasks import LETTERS, NUMBERS

    rng = random.Random(seed)
    words = LETTERS + NUMBERS
    prefixes = [" ".join(rng.choice(words) for _ in range(prefix_tokens)) for _ in range(groups)]
    out = []
    for _i in range(n):
        g, s = rng.randrange(groups), rng.randrange(salts)
        suffix = " ".join(rng.choice(words) for _ in range(suffix_tokens))
        body = {"model": "fixture", "prompt": f"{prefixes[g]} {suffix}", "max_tokens": 4, "temperature": 0}
        if SALTS[s]:
            body["vllm_xargs"] = dict(SALTS[s])
        out.append(body)
    return out


def target_applications(kv_blocks: int | None, names: tuple[str, ...] = DEFAULT_TARGETS) -> list[Application]:
    from benchmarks.harness.targets import shipped_application

    apps = []
    for name in names:
        _label, args, replicas = TARGETS[name]
        a = shipped_application(
            name,
            args=args,
            router_kwargs=ROUTER_KWARGS.get(name),
            replicas=replicas,
            engine_kwargs={"num_gpu_blocks_override": kv_blocks} if kv_blocks else {},
        )
        apps.append(a)
    return apps


def target_apps(kv_blocks: int | None, names: tuple[str, ...] = DEFAULT_TARGETS) -> list[dict[str, Any]]:
    """:func:`target_applications` as their YAML entries."""
    return [to_document_app(a) for a in target_applications(kv_blocks, names)]


async def drive(base_url: str, bodies: list[dict[str, Any]], concurrency: int) -> int:
    """Send every body with ``concurrency`` in flight; the number that failed."""
    import httpx

    sem = asyncio.Semaphore(concurrency)
    failed = 0

    async def one(client, body):
        nonlocal failed
        async with sem:
            r = await client.post(f"{base_url}/v1/completions", json=body)
            failed += r.status_code != 200

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(one(client, b) for b in bodies))
    return failed


def hit_rate(before: dict, after: dict, replicas: set[str]) -> dict[str, Any]:
    """Prompt tokens and the cached share over ``replicas`` between two scrapes."""

    def total(snap, field, source=None):
        return sum(
            (rc.by_source.get(source, 0.0) if source else getattr(rc, field)) for k, rc in snap.items() if k in replicas
        )

    prompt = total(after, "prompt_tokens") - total(before, "prompt_tokens")
    by_source = {s: total(after, None, s) - total(before, None, s) for s in ("local_compute", *CACHED)}
    cached = sum(by_source[s] for s in CACHED)
    per_replica = {
        k: after[k].requests_total - (before[k].requests_total if k in before else 0.0) for k in replicas if k in after
    }
    return {
        "prompt_tokens": prompt,
        "by_source": by_source,
        "hit_rate": cached / prompt if prompt else None,
        "requests_per_replica": per_replica,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--groups", type=int, default=6)
    ap.add_argument("--salts", type=int, default=len(SALTS), choices=range(1, len(SALTS) + 1))
    ap.add_argument("--prefix-tokens", type=int, default=384)
    ap.add_argument("--suffix-tokens", type=int, default=64)
    ap.add_argument("--kv-blocks", type=int, default=48, help="KV pool per replica in blocks (0 = vLLM's sizing)")
    ap.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help=f"comma-separated, of: {', '.join(TARGETS)} (each target's replicas run at once: mind the host's memory)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    args = ap.parse_args(argv)
    names = tuple(args.targets.split(","))
    unknown = sorted(set(names) - set(TARGETS))
    if unknown:
        ap.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    command_logging()
    use_engine_env()
    from benchmarks.serve_stack import _machine
    from fixture_model.build import ensure_model
    from load_tests.observe.scraper import scrape
    from load_tests.operate.local_cluster import LocalCluster

    ensure_model()
    bodies = workload(args.requests, args.groups, args.salts, args.prefix_tokens, args.suffix_tokens)
    cfg = benchmark_config(target_applications(args.kv_blocks or None, names))
    results: dict[str, Any] = {}
    with LocalCluster(num_cpus=32) as cluster:
        cluster.deploy(cfg, wait_ready=False)
        cluster.wait_http({f"/{t}" for t in names})
        for name in names:
            replicas = {
                replica_id(a["name"]) for a in cluster.actors(replica_class_prefix(name, ENGINE_DEPLOYMENT_PREFIX))
            }
            before = scrape(cluster.metrics_urls)
            t = time.monotonic()
            failed = asyncio.run(drive(f"{cluster.base_url}/{name}", bodies, args.concurrency))
            wall = time.monotonic() - t
            after = counted(cluster, scrape, before, replicas, len(bodies) - failed)
            results[name] = {
                "label": TARGETS[name][0],
                "replicas": len(replicas),
                "failed": failed,
                "wall_s": wall,
                **hit_rate(before, after, replicas),
            }
            log.info(
                "%s: hit rate %s, requests per replica %s",
                name,
                results[name]["hit_rate"],
                results[name]["requests_per_replica"],
            )
    meta = {
        "command": "python -m benchmarks.routing_hits " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": _machine(),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "routing_hits.json").write_text(json.dumps({"meta": meta, "targets": results}, indent=2, default=str))
    (args.out / "routing_hits.md").write_text(markdown(meta, results))
    log.info("wrote %s", args.out / "routing_hits.md")
    return 1 if any(r["failed"] for r in results.values()) else 0


def counted(cluster, scrape, before: dict, replicas: set[str], expected: int, timeout_s: float = 180.0) -> dict:
    """A scrape in which ``replicas`` have finished ``expected`` more requests than in ``before``.

    Ray's metrics agent exports each replica's counters every few seconds,
    and a replica's series appear only at their first increment, so "two
    equal scrapes" can come before the last export; the number of requests
    sent cannot.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        now = scrape(cluster.metrics_urls)
        done = sum(
            now[k].requests_total - (before[k].requests_total if k in before else 0.0) for k in replicas if k in now
        )
        if done >= expected:
            return now
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"replicas {sorted(replicas)} counted {done:g} of {expected} requests after {timeout_s:.0f} s"
            )
        time.sleep(2.0)


def markdown(meta: dict[str, Any], results: dict[str, Any]) -> str:
    ref = results.get("R1", {}).get("hit_rate")
    lines = [
        "# Routing and KV-cache hits",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['date']}.",
        "",
        f"Workload: {meta['args']}.",
        "",
        (
            "| target | | hit rate | x R1 | local_compute | local_cache_hit | external_kv_transfer | "
            "requests per replica | failed |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        rate = r["hit_rate"]
        src = r["by_source"]
        lines.append(
            f"| {name} | {r['label']} | {'-' if rate is None else f'{rate:.3f}'} | "
            f"{'-' if rate is None or not ref else f'{rate / ref:.2f}'} | {src['local_compute']:g} | "
            f"{src['local_cache_hit']:g} | {src['external_kv_transfer']:g} | "
            f"{', '.join(f'{v:g}' for v in sorted(r['requests_per_replica'].values()))} | {r['failed']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
