"""What a deployed arm costs the host with no request in flight: its periodic work, process by process.

Question (issue 69): at 1 in flight the shipped stack's Ray processes take 4-7 ms of host CPU per request that
the engine arm does not (docs/benchmarks.md, "The Serve path's own work"), and they take it whether a request
is in flight or not. Which processes, at what rate, and what of it can be switched off with a setting Ray has?

Each arm (``benchmarks.vs_vllm``'s names and variants: ``engine``, ``shipped``,
``shipped+NAME=VALUE``...) is started alone on the host as the benchmark starts it, left ``--settle``
seconds, then every process's CPU time (user + system, ``/proc`` through psutil) is read before and after
``--seconds`` of no traffic. Reported per process (its title) and per role (``cpu_accounting``'s roles), in
CPU milliseconds per wall second; the arms run ``--rounds`` times in turn (ABAB...), since hosts of this kind
drift within a run.

    python -m benchmarks.investigations.idle_cost --arms engine,shipped --rounds 2 --out docs/benchmarks/idle_cost
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import psutil

from benchmarks.harness.arms import load_config, make_arm, require_no_ray, split_arms
from benchmarks.harness.cpu_accounting import CLIENT_ROLE, snapshot
from benchmarks.harness.host import machine
from benchmarks.harness.stopping import stop_on_term
from benchmarks.vs_vllm import REPO
from load_tests.command_logs import command_logging
from serve_app.engine.engine_env import use_engine_env

log = logging.getLogger("fuzzserve.benchmarks.idle_cost")


def _title(p: psutil.Process) -> str:
    """A process's name as a reader knows it: Ray's actor title, else the program and its module or script."""
    try:
        args = p.cmdline()
        name = p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    if args and args[0].startswith(("ray::", "VLLM::")):
        return args[0].split()[0]
    words = [a for a in args[:6] if not a.startswith("-")]
    script = next((Path(a).name for a in words[1:] if a.endswith(".py")), None)
    module = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"), None)
    return f"{name} {script or module or ''}".strip()


def titles(pids: Iterable[int]) -> dict[int, str]:
    """pid -> its title (:func:`_title`), for the processes still alive."""
    out = {}
    for pid in pids:
        try:
            out[pid] = _title(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    return out


def measure(arm_name: str, seconds: float, settle: float, work: Path) -> dict[str, dict[str, float]]:
    """One arm started, settled and watched idle: ``{"roles": role -> ms/s, "processes": title -> ms/s}``."""
    config = load_config(REPO / "serve_config.yaml")
    from fixture_model.build import ensure_model

    with make_arm(arm_name, config, ensure_model(), work / f"{arm_name.replace('=', '-')}-{time.time_ns()}"):
        log.info("%s: serving; %.0f s to settle, then %.0f s idle", arm_name, settle, seconds)
        time.sleep(settle)
        before = snapshot()
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        after = snapshot()
        title = titles(after)
    # one scan per edge: each process's CPU counts once by role and once by title, from the same two readings
    roles: dict[str, float] = defaultdict(float)
    processes: dict[str, float] = defaultdict(float)
    for pid, (role, cpu) in after.items():
        used = max(0.0, cpu - before.get(pid, (role, 0.0))[1])
        roles[role] += used
        processes[title.get(pid, "?")] += used
    to_ms = 1000.0 / elapsed
    return {
        "roles": {k: round(v * to_ms, 2) for k, v in sorted(roles.items(), key=lambda kv: -kv[1])},
        "processes": {k: round(v * to_ms, 2) for k, v in sorted(processes.items(), key=lambda kv: -kv[1]) if v > 0},
    }


# This command's own process is the benchmarks' client role; the `ray start --block` processes it starts take that
# role too (an untitled process takes its nearest named ancestor's).
HARNESS = "this command and its `ray start` processes"


def table(results: dict[str, list[dict[str, dict[str, float]]]], key: str) -> str:
    """A markdown table of CPU ms per wall second, median over the rounds, one column per arm."""
    arms = list(results)
    names = sorted(
        {n for runs in results.values() for r in runs for n in r[key]},
        key=lambda n: -max(statistics.median([r[key].get(n, 0.0) for r in runs]) for runs in results.values()),
    )
    lines = [f"| {'role' if key == 'roles' else 'process'} | " + " | ".join(arms) + " |", "|---|" + "---|" * len(arms)]
    for n in names:
        cells = [statistics.median([r[key].get(n, 0.0) for r in results[a]]) for a in arms]
        if max(cells) >= 0.5:
            lines.append(f"| {HARNESS if n == CLIENT_ROLE else n} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    totals = [statistics.median([sum(r[key].values()) for r in results[a]]) for a in arms]
    lines.append("| **all** | " + " | ".join(f"**{t:.1f}**" for t in totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arms", default="engine,shipped", help="vs_vllm's arm names, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=60.0, help="how long each arm is watched idle")
    ap.add_argument("--settle", type=float, default=30.0, help="how long after it serves before watching")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    command_logging()
    stop_on_term()
    use_engine_env()
    require_no_ray("before the measurement")
    arms = split_arms(args.arms)
    work = Path(tempfile.mkdtemp(prefix="fuzzserve-idle-"))
    results: dict[str, list[dict[str, dict[str, float]]]] = {a: [] for a in arms}
    for r in range(args.rounds):
        for a in arms if r % 2 == 0 else reversed(arms):
            results[a].append(measure(a, args.seconds, args.settle, work))
            log.info("round %d %s: %.1f ms/s", r + 1, a, sum(results[a][-1]["roles"].values()))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python -m benchmarks.investigations.idle_cost " + " ".join(sys.argv[1:]),
        "machine": machine(),
        "seconds": args.seconds,
        "settle": args.settle,
        "rounds": args.rounds,
    }
    (args.out / "idle_cost.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    sys.stdout.write(write_report(args.out, meta, results))
    return 0


def write_report(out: Path, meta: dict, results: dict[str, list[dict[str, dict[str, float]]]]) -> str:
    """``idle_cost.md`` in ``out``, from the run's record; returned too."""
    report = (
        f"# Idle cost: host CPU ms per wall second, no request in flight\n\n`{meta['command']}`; {meta['machine']}; "
        f"{meta['seconds']:.0f} s watched after {meta['settle']:.0f} s settled, median of {meta['rounds']} rounds.\n\n"
        f"## By role\n\n{table(results, 'roles')}\n\n## By process\n\n{table(results, 'processes')}\n"
    )
    (out / "idle_cost.md").write_text(report)
    return report


if __name__ == "__main__":
    sys.exit(main())
