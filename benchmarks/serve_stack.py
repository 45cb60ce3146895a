r"""What each layer costs: the same workload against every serving stack, interleaved, as ratios to plain vLLM.

    python -m benchmarks.serve_stack [--rounds 3] [--requests 200] [--concurrency 32] [--out docs/benchmarks]

Workload (fixture model): prompts of ``--prompt-tokens`` tokens (128), ``--output-tokens``
(64) generated with ``ignore_eos``, greedy, fixed concurrency, streamed; a
``prefix`` variant puts 256 shared tokens (two KV blocks, four groups) in
front of each prompt. Targets:

====  =====================================================================
a     vLLM's OpenAI server, patches off (stock vLLM)                 [reference]
b     stock ``ray.serve.llm`` (``build_openai_app``), 1 replica, patches off
c0    this project's app, 1 replica, patches off (no offloading: it is a patch on CPU)
c1    this project's app, 1 replica, patches on but offloading off, s = 0
      (c1 / c0 is what the fuzz and accounting patches cost at s = 0)
c1s   as c1 with the ``shm_wait`` patch off (c1s / c0: the other patches alone)
c     this project's app, 1 replica, patches on (offloading on), s = 0
cb    as c, the engine's OpenMP threads bound to core 0 only (the thread-binding
      lever: with a KV connector, vLLM's ``auto`` binding takes both cores)
d     as c, every request fuzzed (the load tests' strength/mode mix)
e     this project's app, 2 replicas, s = 0
bd    stock ``ray.serve.llm`` with direct streaming + HAProxy, patches off
f0    this project's app, ``ingress: direct``, patches off
f     this project's app, ``ingress: direct`` (direct streaming + HAProxy,
      checks inside the replica), patches on, s = 0
fb    as f, the engine's OpenMP threads bound to core 0 only
fbs   as fb with the ``shm_wait`` patch off: EngineCore and its worker spin
      (upstream) instead of napping while they wait for each other
c0b   as c0, the engine's OpenMP threads bound to core 0 \  the patches A/B with
c1b   as c1, the engine's OpenMP threads bound to core 0 /   the engine's core fixed
eb    as e, each replica's engine on its own core (``engine_cores_per_replica: 1``)
fbr   as fb, deployed beside fbt, fbq, fbn and fbc (the levers phase's control)
fbt   as fb, Serve runs the replica's user code on its main event loop
      (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``: no cross-thread hand-off
      per request and per streamed message)
fbq   as fbt, Serve's per-request access log off (``logging_config``)
fbn   as fb, ``shm_wait`` naps 50 us instead of 200 us
fbc   as f with ``engine_cores_per_replica: 1``: the engine's OpenMP threads on
      core 0 as in fb, and EngineCore pinned there too (it takes turns with the
      worker), leaving core 1 to the replica's HTTP process and Serve
fb1   as fbc, the only application in its cluster (every other phase deploys
      its targets side by side, and the idle ones cost CPU too): the best
      stack measured, as one would deploy it
fb1s  as fb1 with the ``shm_wait`` patch off, alone in its cluster: with
      EngineCore and its worker on one core, does upstream's spin (which
      yields the core to the other) beat the nap (which can leave it idle)?
fb1n  as fb1 with a 50 us ``shm_wait`` nap, alone in its cluster
e1    as eb (two replicas, each engine and its EngineCore on a core of its own:
      the shipped serve_config.yaml), the only application in its cluster
e1s   as e1 with the ``shm_wait`` patch off, alone in its cluster
ceil  offline ``LLM.generate`` on the same prompts (no HTTP at all)
====  =====================================================================

Phases, each its own Ray cluster (a vLLM server stays up throughout, so
every phase measures ``a`` too): ``offstack`` (b, c0, c1, c1s), ``onstack`` (c, cb, d,
e), ``direct`` (bd, f0, f, fb, fbs; the cluster runs Serve's HAProxy), ``bound``
(c0b, c1b, eb), ``levers`` (fbr, fbt, fbq, fbn, fbc: Ray Serve's replica-side
levers, the nap and EngineCore's placement on the best stack; HAProxy), ``alone``
(fb1; HAProxy), ``alonespin`` (fb1s; HAProxy), ``alonenap`` (fb1n; HAProxy),
``two`` (e1), ``twospin`` (e1s), then the ceiling.
Within a phase runs are interleaved round by round (a b c0 a b c0 ...), and
each target's numbers are divided by the same round's ``a``, so drift of
the machine cancels, and runs are kept ``--settle-s`` (1.5 s) apart so
that no run starts while the previous target's stock engine still spins
(upstream spins for 1 s after the last step; runs before 2026-11-23 17:10
had no pause). Results: ``serve_stack.json`` and ``serve_stack.md``
in ``--out``, with the command line that produced them, rewritten after
every phase; a phase that fails is recorded there and the others still run.

This is a benchmark, not a test: nothing here asserts a target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("fuzzserve.benchmarks")

REPO = Path(__file__).resolve().parents[1]
ENGINE = {"dtype": "float32", "enforce_eager": True, "max_model_len": 1024, "enable_prefix_caching": True}
OFFLOAD = {"kv_offloading_size": 0.25, "kv_offloading_backend": "native"}
# Pause before each run: a stock vLLM engine (EngineCore and worker) keeps
# spinning for 1 s after its last step (upstream's busy window), which would
# otherwise compete with the first second of the next run.
SETTLE_S = 1.5
PHASES = {"offstack": ("b", "c0", "c1", "c1s"), "onstack": ("c", "cb", "d", "e"), "direct": ("bd", "f0", "f", "fb", "fbs"),
          "bound": ("c0b", "c1b", "eb"), "levers": ("fbr", "fbt", "fbq", "fbn", "fbc"),
          "alone": ("fb1",), "alonespin": ("fb1s",), "alonenap": ("fb1n",), "two": ("e1",), "twospin": ("e1s",)}
HAPROXY_PHASES = ("direct", "levers", "alone", "alonespin", "alonenap")  # clusters running Serve's HAProxy
LABELS = {
    "a": "vLLM server, patches off",
    "b": "stock ray.serve.llm, 1 replica",
    "c0": "fuzzserve 1 replica, patches off",
    "c1": "fuzzserve 1 replica, patches on, offloading off, s=0",
    "c1s": "as c1, shm_wait patch off (upstream spin)",
    "c": "fuzzserve 1 replica, patches on, s=0",
    "cb": "as c, engine threads bound to core 0",
    "d": "fuzzserve 1 replica, fuzz mix",
    "e": "fuzzserve 2 replicas, s=0",
    "bd": "stock ray.serve.llm, direct streaming + HAProxy",
    "f0": "fuzzserve direct (guard in replica), patches off",
    "f": "fuzzserve direct (guard in replica), patches on, s=0",
    "fb": "as f, engine threads bound to core 0",
    "fbs": "as fb, shm_wait patch off (upstream spin)",
    "c0b": "as c0, engine threads bound to core 0",
    "c1b": "as c1, engine threads bound to core 0",
    "eb": "as e, each replica's engine on its own core",
    "fbr": "as fb (the levers phase's control)",
    "fbt": "as fb, user code on the replica's main event loop",
    "fbq": "as fbt, access log off",
    "fbn": "as fb, shm_wait nap 50 us",
    "fbc": "as f, engine_cores_per_replica 1 (EngineCore on the engine's core too)",
    "fb1": "as fbc, the only application in its cluster",
    "fb1s": "as fb1 with shm_wait off (upstream spin), alone",
    "fb1n": "as fb1 with a 50 us shm_wait nap, alone",
    "e1": "as eb (the shipped config), alone",
    "e1s": "as e1 with shm_wait off (upstream spin), alone",
    "ceil": "offline LLM.generate",
}


# ----------------------------------------------------------------------------- workload
WARMUP_SEED = 7_777_777  # the warm-up's prompts (the measured runs use seed 0)


def prompts(n: int, tokens: int, variant: str, seed: int = 0) -> list[str]:
    """``n`` prompts of ``tokens`` tokens (one fixture-vocabulary word per token, <s> included)."""
    from fixture_model.tasks import LETTERS, NUMBERS

    rng = random.Random(seed)
    words = LETTERS + NUMBERS
    prefixes = [" ".join(rng.choice(words) for _ in range(256)) for _ in range(4)]
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words) for _ in range(tokens - 1))
        out.append(f"{prefixes[i % 4]} {body}" if variant == "prefix" else body)
    return out


def fuzz_xargs(i: int) -> dict[str, Any]:
    from load_tests.workload import FUZZ_LEVELS

    rng = random.Random(i)
    return {"fuzz_strength": rng.choice(FUZZ_LEVELS[1:]), "fuzz_mode": rng.choice(("scale", "gaussian")),
            "fuzz_seed": rng.randrange(4)}


async def run_http(base_url: str, ps: list[str], out_tokens: int, concurrency: int, fuzz: bool,
                   api_key: str | None = None) -> dict[str, Any]:
    """Stream every prompt through ``base_url`` with ``concurrency`` in flight; return throughput and latency."""
    import aiohttp

    from load_tests.client import send
    from load_tests.profiles import Profile, drive
    from load_tests.workload import RequestSpec

    results = []
    t0 = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(i: int) -> None:
            body = {"model": "fixture", "prompt": ps[i], "max_tokens": out_tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            if fuzz:
                body["vllm_xargs"] = fuzz_xargs(i)
            spec = RequestSpec(i, "/v1/completions", body, stream=True)
            results.append(await send(session, base_url, spec, t0, timeout_s=600, headers=headers))

        await drive(Profile(kind="fixed", concurrency=concurrency, max_requests=len(ps)), one)
    wall = time.monotonic() - t0
    ok = [r for r in results if r.outcome == "ok"]
    if len(ok) != len(ps):
        bad = [r for r in results if r.outcome != "ok"][:3]
        raise RuntimeError(f"{base_url}: {len(ps) - len(ok)} of {len(ps)} requests failed: {[r.to_json() for r in bad]}")
    # A fuzzed stream may carry no visible text at all (ignore_eos on noise-driven
    # tokens that decode to ""): it has no TTFT, and counts for throughput only.
    return _stats(wall, [r.ttft for r in ok if r.ttft is not None], [x for r in ok for x in r.itl],
                  sum(r.completion_tokens or r.chunks for r in ok), len(ok))


def _stats(wall: float, ttft: list[float], itl: list[float], tokens: int, n: int) -> dict[str, Any]:
    import numpy as np

    def pct(xs, p):
        return float(np.percentile(xs, p)) if xs else None

    return {"wall_s": wall, "requests": n, "req_per_s": n / wall, "tok_per_s": tokens / wall,
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99)}


# ----------------------------------------------------------------------------- targets
def start_vllm_server(model: Path, log_dir: Path):
    from serve_app.ports import free_port
    from tests.server_process import ServerProcess

    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--served-model-name", "fixture", "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
            "--enable-prefix-caching", "--host", "127.0.0.1", "--port", str(port)]
    srv = ServerProcess(argv, f"http://127.0.0.1:{port}/health", log_path=log_dir / "vllm_server.log",
                        env={"FUZZSERVE_PATCHES_OFF": "all", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"})
    return srv, f"http://127.0.0.1:{port}"


def llm_config(model: Path, replicas: int, offload: bool) -> dict[str, Any]:
    return {"model_loading_config": {"model_id": "fixture", "model_source": str(model)},
            "accelerator_config": {"kind": "cpu"},
            "deployment_config": {"autoscaling_config": {"min_replicas": replicas, "max_replicas": replicas}},
            "engine_kwargs": {**ENGINE, **(OFFLOAD if offload else {})}}


def app(name: str, model: Path, *, stock: bool, replicas: int = 1, patches: bool = True,
        direct: bool = False, offload: bool | None = None, omp_bind: str | None = None,
        patches_off: str | None = None, cores_per_replica: int | None = None,
        user_code_thread: bool = True, access_log: bool = True, nap_s: float | None = None) -> dict[str, Any]:
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if nap_s is not None:
        env["FUZZSERVE_SHM_NAP_S"] = str(nap_s)
    if not user_code_thread:
        env["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] = "0"
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind
    if not patches:
        env["FUZZSERVE_PATCHES_OFF"] = "all"
    elif patches_off:
        env["FUZZSERVE_PATCHES_OFF"] = patches_off
    if direct and stock:
        env["RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"] = "1"
    cfg = llm_config(model, replicas, offload=patches if offload is None else offload)
    if stock:
        return {"name": name, "route_prefix": f"/{name}", "import_path": "ray.serve.llm:build_openai_app",
                "runtime_env": {"env_vars": env}, "args": {"llm_configs": [cfg]}}
    args: dict[str, Any] = {"llm_configs": [cfg], "guard": {"api_keys_env": None}}
    if direct:
        args["ingress"] = "direct"
    if cores_per_replica is not None:
        args["engine_cores_per_replica"] = cores_per_replica
    out = {"name": name, "route_prefix": f"/{name}", "import_path": "serve_app.app:build_app",
           "runtime_env": {"env_vars": env}, "args": args}
    if not access_log:
        out["logging_config"] = {"enable_access_log": False}
    return out


def phase_config(phase: str, model: Path) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """(serve config, target -> route prefix, cluster env) of a phase."""
    apps = {
        "offstack": [app("b", model, stock=True, patches=False), app("c0", model, stock=False, patches=False),
                     app("c1", model, stock=False, offload=False),
                     app("c1s", model, stock=False, offload=False, patches_off="shm_wait")],
        "onstack": [app("c", model, stock=False), app("cb", model, stock=False, omp_bind="0"),
                    app("e", model, stock=False, replicas=2)],
        "direct": [app("bd", model, stock=True, patches=False, direct=True),
                   app("f0", model, stock=False, patches=False, direct=True),
                   app("f", model, stock=False, direct=True),
                   app("fb", model, stock=False, direct=True, omp_bind="0"),
                   app("fbs", model, stock=False, direct=True, omp_bind="0", patches_off="shm_wait")],
        "bound": [app("c0b", model, stock=False, patches=False, omp_bind="0"),
                  app("c1b", model, stock=False, offload=False, omp_bind="0"),
                  app("eb", model, stock=False, replicas=2, cores_per_replica=1)],
        "levers": [app("fbr", model, stock=False, direct=True, omp_bind="0"),
                   app("fbt", model, stock=False, direct=True, omp_bind="0", user_code_thread=False),
                   app("fbq", model, stock=False, direct=True, omp_bind="0", user_code_thread=False,
                       access_log=False),
                   app("fbn", model, stock=False, direct=True, omp_bind="0", nap_s=0.00005),
                   app("fbc", model, stock=False, direct=True, cores_per_replica=1)],
        "alone": [app("fb1", model, stock=False, direct=True, cores_per_replica=1)],
        "alonespin": [app("fb1s", model, stock=False, direct=True, cores_per_replica=1, patches_off="shm_wait")],
        "alonenap": [app("fb1n", model, stock=False, direct=True, cores_per_replica=1, nap_s=0.00005)],
        "two": [app("e1", model, stock=False, replicas=2, cores_per_replica=1)],
        "twospin": [app("e1s", model, stock=False, replicas=2, cores_per_replica=1, patches_off="shm_wait")],
    }[phase]
    routes = {a["name"]: a["route_prefix"] for a in apps}
    if phase == "onstack":
        routes["d"] = routes["c"]
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"} if phase in HAPROXY_PHASES else {}
    cfg = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": 8000, "request_timeout_s": 600},
           "applications": apps}
    return cfg, routes, env


def offline_ceiling(model: Path, ps: list[str], out_tokens: int) -> dict[str, Any]:
    """The same prompts through ``LLM.generate`` in a child process (patches off, no HTTP)."""
    from tests.engine_host import EngineHost

    host = EngineHost(env={"FUZZSERVE_PATCHES_OFF": "all", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
                      model=str(model), **ENGINE)
    try:
        params = {"temperature": 0.0, "max_tokens": out_tokens, "ignore_eos": True}
        host.generate(ps[:8], params)  # warm-up
        t = time.monotonic()
        outs = host.generate(ps, params)
        wall = time.monotonic() - t
    finally:
        host.close()
    return _stats(wall, [], [], sum(len(o["token_ids"]) for o in outs), len(outs))


# ----------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=200, help="requests per run")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--variants", default="plain,prefix")
    ap.add_argument("--phases", default="offstack,onstack,direct,bound,levers,alone,ceiling")
    ap.add_argument("--settle-s", type=float, default=SETTLE_S,
                    help="pause before each run: a stock engine keeps spinning for 1 s after its last step")
    ap.add_argument("--warmup-requests", type=int, default=64,
                    help="unmeasured requests per target and variant before a phase's first round (0 = none)")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    ap.add_argument("--update", action="store_true",
                    help="rerun only --phases: keep the other phases' runs from the serve_stack.json in --out")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx",):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fixture_model.build import ensure_model

    model = ensure_model()
    args.out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",")
    phases = args.phases.split(",")
    work = {v: prompts(args.requests, args.prompt_tokens, v) for v in variants}
    runs: list[dict[str, Any]] = []
    log_dir = Path(tempfile.mkdtemp(prefix="fuzzserve-bench-"))  # server and cluster logs, not results
    log.info("logs in %s", log_dir)

    meta = {"command": "python -m benchmarks.serve_stack " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": _machine(),
            "workload": {"prompt_tokens": args.prompt_tokens, "output_tokens": args.output_tokens,
                         "concurrency": args.concurrency, "requests_per_run": args.requests, "rounds": args.rounds},
            "failed_phases": {}}
    previous = args.out / "serve_stack.json"
    if args.update and previous.exists():
        old = json.loads(previous.read_text())
        if old["meta"]["workload"] != meta["workload"]:
            raise SystemExit(f"--update: {previous} was measured with another workload: {old['meta']['workload']}")
        runs.extend(r for r in old["runs"] if r["phase"] not in phases)
        meta["command"] = f"{old['meta']['command']}; then {meta['command']}"
        meta["date"] = f"{old['meta']['date']}; then {meta['date']}"
        meta["failed_phases"] = {k: v for k, v in old["meta"].get("failed_phases", {}).items() if k not in phases}
        if old["meta"].get("notes"):
            meta["notes"] = old["meta"]["notes"]

    def write() -> None:  # after every phase: a later failure loses nothing measured
        table = ratios(runs)
        (args.out / "serve_stack.json").write_text(json.dumps({"meta": meta, "runs": runs, "ratios": table}, indent=2))
        (args.out / "serve_stack.md").write_text(markdown(meta, table, runs))

    srv, base_a = start_vllm_server(model, log_dir)
    try:
        for phase in [p for p in phases if p in PHASES]:
            try:
                run_phase(phase, model, args, work, base_a, runs, log_dir / phase)
            except Exception as e:  # record it and go on to the next phase
                log.exception("phase %s failed", phase)
                meta["failed_phases"][phase] = f"{type(e).__name__}: {str(e)[:1000]}"
            write()
    finally:
        srv.close()
    if "ceiling" in phases:
        for variant in variants:
            runs.append({"phase": "ceiling", "round": 0, "variant": variant, "target": "ceil",
                         **offline_ceiling(model, work[variant], args.output_tokens)})
    write()
    log.info("wrote %s", args.out / "serve_stack.md")
    return 1 if meta["failed_phases"] else 0


def run_phase(phase: str, model: Path, args, work: dict[str, list[str]], base_a: str, runs: list, log_dir: Path):
    """One phase: its own Ray cluster, every target interleaved with ``a`` round by round."""
    from rich.progress import Progress

    from benchmarks import cpu_accounting
    from serve_app.local_cluster import LocalCluster

    cfg, routes, env = phase_config(phase, model)
    targets = ["a", *PHASES[phase]]
    variants = list(work)
    # Logical CPUs (Ray's scheduling units, not cores) enough to place every
    # target of a phase at once: four engine replicas plus their ingresses
    # overflow the default 8 and a router would wait forever to be scheduled.
    with LocalCluster(env=env, log_dir=log_dir, num_cpus=32) as cluster:
        log.info("phase %s: deploying %s", phase, ", ".join(routes))
        cluster.deploy(cfg, wait_ready=False)
        cluster.wait_http(set(routes.values()))
        bases = {"a": base_a, **{t: cluster.base_url + routes[t] for t in PHASES[phase]}}
        warm_up(bases, args, variants)
        with Progress() as progress:
            task = progress.add_task(f"phase {phase}", total=args.rounds * len(variants) * len(targets))
            for rnd in range(args.rounds):
                for variant in variants:
                    for t in targets:  # interleaved: a b c ... a b c ...
                        time.sleep(args.settle_s)  # the previous target's engine stops spinning
                        before = cpu_accounting.snapshot()
                        stats = asyncio.run(run_http(bases[t], work[variant], args.output_tokens,
                                                     args.concurrency, fuzz=(t == "d")))
                        cpu = cpu_accounting.delta(before, cpu_accounting.snapshot())
                        runs.append({"phase": phase, "round": rnd, "variant": variant, "target": t, **stats,
                                     "cpu_s": cpu_columns(cpu, APP_OF.get(t, t)),
                                     "warmup_requests": args.warmup_requests})
                        progress.advance(task)


def warm_up(bases: dict[str, str], args, variants: list[str]) -> None:
    """Send every target of a phase ``--warmup-requests`` unmeasured requests per variant.

    Each phase deploys its targets fresh, while the vLLM server (a) stays up
    for the whole benchmark and is warm after the first phase: without this,
    every target's first round paid its cold start (first requests through
    a new replica, HTTP connections, the engine's first large batches) and
    ``a``'s did not. Found 2026-11-24: over every phase then on record, the
    median of target / same round's ``a`` was 0.45 in round 0 against 0.57
    and 0.61 in rounds 1 and 2. Other prompts than the measured ones (their
    own seed), so that the warm-up leaves nothing in a prefix cache that the
    measured runs could hit.
    """
    if args.warmup_requests <= 0:
        return
    for variant in variants:
        ps = prompts(args.warmup_requests, args.prompt_tokens, variant, seed=WARMUP_SEED)
        for t, base in bases.items():
            asyncio.run(run_http(base, ps, args.output_tokens, args.concurrency, fuzz=(t == "d")))


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, target): the median over rounds of value / the same phase-round-variant's ``a``."""
    keys = ("req_per_s", "tok_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
    ref = {(r["phase"], r["round"], r["variant"]): r for r in runs if r["target"] == "a"}
    a_all = [r for r in runs if r["target"] == "a"]
    out = []
    for variant in sorted({r["variant"] for r in runs}):
        for target in [t for t in LABELS if any(r["target"] == t and r["variant"] == variant for r in runs)]:
            mine = [r for r in runs if r["target"] == target and r["variant"] == variant]
            row: dict[str, Any] = {"variant": variant, "target": target, "label": LABELS[target], "runs": len(mine)}
            for k in keys:
                vals = [r[k] for r in mine if r.get(k) is not None]
                row[k] = statistics.median(vals) if vals else None
                per_round = []
                for r in mine:
                    base = ref.get((r["phase"], r["round"], variant))
                    if base is None:  # the ceiling: against the median of every a run
                        bs = [x[k] for x in a_all if x["variant"] == variant and x.get(k) is not None]
                        b = statistics.median(bs) if bs else None
                    else:
                        b = base.get(k)
                    if r.get(k) is not None and b:
                        per_round.append(r[k] / b)
                row[f"{k}_x_a"] = statistics.median(per_round) if per_round else None
            out.append(row)
    return out


def _fmt(v, scale=1.0, unit="", digits=1):
    return "-" if v is None else f"{v * scale:.{digits}f}{unit}"


def markdown(meta: dict[str, Any], table: list[dict[str, Any]], runs: list[dict[str, Any]] | None = None) -> str:
    w = meta["workload"]
    lines = ["# Serving stack benchmark", "",
             f"`{meta['command']}` on {meta['machine']}, {meta['date']}.", "",
             f"{w['prompt_tokens']} prompt tokens, {w['output_tokens']} output tokens (ignore_eos), streamed, "
             f"concurrency {w['concurrency']}, {w['requests_per_run']} requests per run, {w['rounds']} interleaved "
             "rounds; each number is the median over rounds, each ratio the median of (run / the same round's a).", ""]
    for phase, why in meta.get("failed_phases", {}).items():
        lines += [f"**Phase {phase} failed**: {why}", ""]
    if meta.get("notes"):
        lines += [f"Note: {meta['notes']}", ""]
    if runs is not None:
        warmed = sorted({r["phase"] for r in runs if r.get("warmup_requests")})
        cold = sorted({r["phase"] for r in runs if not r.get("warmup_requests") and r["phase"] != "ceiling"})
        if cold:
            lines += [f"Warm-up before the first round: {', '.join(warmed) or 'no phase'}; measured without it "
                      f"(every target's first round paid its cold start, `a`'s did not): {', '.join(cold)}.", ""]
    for variant in sorted({r["variant"] for r in table}):
        lines += [f"## Workload: {variant}", "",
                  "| target | | req/s | x a | tok/s | TTFT p50 ms | x a | TTFT p99 ms | ITL p50 ms | x a | ITL p99 ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (r for r in table if r["variant"] == variant):
            lines.append(f"| {r['target']} | {r['label']} | {_fmt(r['req_per_s'])} | {_fmt(r['req_per_s_x_a'], digits=2)} | "
                         f"{_fmt(r['tok_per_s'], digits=0)} | {_fmt(r['ttft_p50'], 1000, digits=0)} | "
                         f"{_fmt(r['ttft_p50_x_a'], digits=2)} | {_fmt(r['ttft_p99'], 1000, digits=0)} | "
                         f"{_fmt(r['itl_p50'], 1000)} | {_fmt(r['itl_p50_x_a'], digits=2)} | {_fmt(r['itl_p99'], 1000)} |")
        lines.append("")
        if runs is not None:
            lines += cpu_markdown(runs, variant)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- where the CPU goes
APP_OF = {"d": "c"}  # d is c's application, driven with fuzz
CPU_COLUMNS = ("client", "proxy", "ingress", "frontend", "engine", "Ray", "idle targets")


def cpu_columns(cpu: dict[str, float], app: str) -> dict[str, float]:
    """Fold per-role CPU seconds (see ``cpu_accounting``) into the columns of one target's run.

    ``frontend`` is the process that runs vLLM's AsyncLLM: the API server for
    ``a``, the engine replica (``LLMServer``) for the Serve targets, which in
    the direct-streaming targets also serves HTTP. ``ingress`` is the router
    replica (``OpenAiIngress``/``FuzzRouter``). ``engine`` is EngineCore and its
    worker process (scheduler, model, KV offload copies). ``idle targets`` is what the
    other targets' processes (up, but not driven) used meanwhile.
    """
    out = dict.fromkeys(CPU_COLUMNS, 0.0)
    for role, sec in cpu.items():
        if role == "load generator":
            col = "client"
        elif role == "Serve proxy":
            col = "proxy"
        elif role in ("Serve controller", "Ray system", "Ray worker (other)"):
            col = "Ray"
        elif role == "vLLM API server":
            col = "frontend" if app == "a" else "idle targets"
        elif role == "EngineCore of vLLM API server":
            col = "engine" if app == "a" else "idle targets"
        elif role.startswith(f"replica {app}:"):
            col = "frontend" if "Server" in role else "ingress"
        elif role.startswith(f"EngineCore of replica {app}:"):
            col = "engine"
        else:
            col = "idle targets"
        out[col] += sec
    return out


def cpu_markdown(runs: list[dict[str, Any]], variant: str) -> list[str]:
    """Median over rounds of CPU milliseconds per request, per column, for each target."""
    lines = [f"### Where the CPU goes ({variant}): CPU ms per request, median over rounds", "",
             "| target | " + " | ".join(CPU_COLUMNS) + " | total | cores busy |",
             "|---|" + "---|" * (len(CPU_COLUMNS) + 2)]
    for t in LABELS:
        mine = [r for r in runs if r["target"] == t and r["variant"] == variant and r.get("cpu_s")]
        if not mine:
            continue
        cells = [statistics.median(1000 * r["cpu_s"][c] / r["requests"] for r in mine) for c in CPU_COLUMNS]
        total = statistics.median(1000 * sum(r["cpu_s"].values()) / r["requests"] for r in mine)
        busy = statistics.median(sum(r["cpu_s"].values()) / r["wall_s"] for r in mine)
        lines.append(f"| {t} | " + " | ".join(f"{c:.0f}" for c in cells) + f" | {total:.0f} | {busy:.2f} |")
    return lines + [""]


def _machine() -> str:
    import psutil

    return f"{platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, " \
           f"{psutil.virtual_memory().total // (1 << 30)} GiB, Python {platform.python_version()}"


if __name__ == "__main__":
    sys.exit(main())
