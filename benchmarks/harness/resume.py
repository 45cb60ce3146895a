"""Continuing a stopped headline run: the phases it measured are kept, the rest are run.

Why: the headline's protocol (4 arms, 6 pairs, six run labels each) takes 2.6 h
on a host of this kind at its usual speed and about 4 h when the host runs
slower, longer than a working session has; a run stopped half-way kept its
data (``vs_vllm.json`` is rewritten after every phase) but could only be
started again from nothing. The protocol's statistic is pair by pair (each
figure's ratio of two arms within one pair), so a pair measured in another
sitting is as good as one measured in this one, **provided** it measured the
same thing: the same workload, arms, pairs and seed (so the same prompts), on
the same machine kind, with the same code under test. :func:`check_same`
refuses anything else, naming what differs; what was resumed, when and where,
is recorded in the results.

A pair is kept when every arm of it has a valid run at every run label (void
runs count nowhere, as in a single sitting); a pair measured only in part, or
never reached, runs in full, each phase's attempts numbered after the ones
already recorded, so that each pair's arms are measured in one sitting.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# What a headline run measures or is measured with: a change in any of them between sittings makes the pairs of
# the two sittings measure different things.
MEASURED_PATHS = (
    "serve_app",
    "patches",
    "serve_config.yaml",
    "fixture_model",
    "benchmarks/harness",
    "benchmarks/vs_vllm.py",
    "pyproject.toml",
)


class ResumeRefused(ValueError):
    """The recorded run cannot be continued by this command, here (the message names what differs)."""


def code_version(repo: Path = REPO, paths: Sequence[str] = MEASURED_PATHS) -> str | None:
    """The git tree of ``paths`` at HEAD (``tree:<hash>``), or None where that cannot vouch for the code: not a
    git checkout, or any of ``paths`` changed and not committed."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=False)
        except OSError:  # no such directory, or no git
            return None
        return done.stdout if done.returncode == 0 else None

    dirty = git("status", "--porcelain", "--untracked-files=all", "--", *paths)
    if dirty is None or dirty.strip():
        return None
    # the trees (or blobs) of the measured paths at HEAD: equal exactly when every one of them is unchanged
    trees = git("rev-parse", *[f"HEAD:{p}" for p in paths])
    if trees is None:
        return None
    return "tree:" + ",".join(line[:12] for line in trees.split())


def load(out: Path) -> dict[str, Any]:
    """The recorded results in ``out`` (``vs_vllm.json``)."""
    path = out / "vs_vllm.json"
    if not path.exists():
        raise ResumeRefused(f"nothing to resume: {path} does not exist")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def check_same(recorded: dict[str, Any], now: dict[str, Any]) -> None:
    """Raise :class:`ResumeRefused` unless ``now`` (this command's meta) measures what ``recorded`` (the stopped
    run's meta) did: the same workload (arms, pairs, seed, every setting), machine kind and code."""
    if now.get("code") is None:
        raise ResumeRefused(
            "this checkout cannot vouch for its code (not a git checkout, or uncommitted changes under "
            f"{', '.join(MEASURED_PATHS)}): commit them first"
        )
    if recorded.get("code") != now["code"]:
        raise ResumeRefused(
            f"the code under test changed: the run recorded {recorded.get('code')!r}, this checkout is "
            f"{now['code']!r} (git tree of {', '.join(MEASURED_PATHS)})"
        )
    if recorded.get("machine") != now.get("machine"):
        raise ResumeRefused(f"another machine: recorded {recorded.get('machine')!r}, here {now.get('machine')!r}")
    old, new = recorded.get("workload", {}), json.loads(json.dumps(now.get("workload", {})))
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if differ:
        raise ResumeRefused(
            "another measurement: " + "; ".join(f"{k}: recorded {old.get(k)!r}, now {new.get(k)!r}" for k in differ)
        )


def done_phases(runs: Iterable[dict[str, Any]], labels: Sequence[str], arms: Sequence[str]) -> set[tuple[int, str]]:
    """(pair, arm) of every phase kept: those of each pair in which **every** arm has a valid (non-void) run at
    each of ``labels``. A pair measured only in part runs again in full, so that no pair's ratio compares arms
    measured in different sittings (the host's speed differs from one to the next: 0.5-1x on this machine kind)."""
    valid: dict[tuple[int, str], set[str]] = {}
    for r in runs:
        if r.get("void") is None:
            valid.setdefault((r["pair"], r["stack"]), set()).add(r["label"])
    pairs = {pair for pair, _ in valid}
    whole = {p for p in pairs if all(set(labels) <= valid.get((p, arm), set()) for arm in arms)}
    return {(p, arm) for p in whole for arm in arms}


def next_attempt(runs: Iterable[dict[str, Any]], pair: int, stack: str) -> int:
    """The first attempt number not yet recorded for the phase (0 where it never ran)."""
    return 1 + max((r.get("attempt", 0) for r in runs if r["pair"] == pair and r["stack"] == stack), default=-1)
