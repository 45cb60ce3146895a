"""Upstream vLLM 0.32.0's own unit tests for the areas the patches touch, run against the patched install,
once with the patches on and once with ``FUZZSERVE_PATCHES_OFF=all``, outcome by outcome.

    python -m testkit.upstream_vllm            # fetch (first run), run both ways, compare; exit 1 on a new difference
    python -m testkit.upstream_vllm --list     # only the tests it would run

Optional (not part of CI): it fetches the ``vllm==0.32.0`` sdist with pip
(the sdist ships upstream's ``tests/``; about 2 minutes the first time,
cached in ``.cache/upstream/``) and runs each area's tests in a pytest
subprocess rooted in the unpacked tree, so upstream's conftests apply.

No model hub is reachable here, and most of these tests build a
``VllmConfig`` of ``facebook/opt-125m`` (only its config: the scheduler
needs the shapes, not the weights), so the runner gives them an offline
Hugging Face cache holding a stand-in ``config.json`` with that model's
shapes (:data:`STAND_IN_CONFIGS`); a test that needs more (weights, a
tokenizer, another model) fails the same way both ways and is reported as
not applicable.

Why it is needed: upstream's tests build schedulers, connectors and stat
loggers directly, often with ``MagicMock`` configs, which is exactly where a
patch that assumes a real engine can break vLLM for everyone else (it did:
``kv_faults`` validated a MagicMock's connector config). vLLM loads plugins
only when an engine or its config is built, so a unit test would not see
the patches at all; the ``fuzzserve_upstream`` pytest plugin
(``testkit/upstream_plugin/``) loads them first, as every vLLM process does.

Verdict, per test (``docs/upstream_tests.md`` lists every difference):

* same outcome both ways: passed, or *not applicable on this host* (skipped
  by upstream, or failed both ways for a reason of the host: no GPU, a
  package or a model that is not here; named per test), or failed both ways
  for another reason (listed: upstream on this CPU host, not the patches);
* a different outcome: run again both ways; if the outcomes then agree it
  was a flaky test of this busy host (listed as such); if it repeats, it is
  allowed only if listed in :data:`DELIBERATE` with the patch behaviour that
  explains it. An unlisted difference, or a listed one that no longer
  differs, fails the command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import NamedTuple

from patches.early_submit import ENABLE_ENV as EARLY_SUBMIT_ENV
from patches.framework.switches import OFF_ENV
from patches.stats_thread import ENABLE_ENV as STATS_THREAD_ENV
from serve_app.engine.engine_env import HF_HUB_OFFLINE

REPO = Path(__file__).resolve().parents[1]
CACHE = (REPO / ".cache" / "upstream").resolve()  # real path: pytest's test ids are relative to it
VERSION = "0.32.0"
SDIST = CACHE / f"vllm-{VERSION}.tar.gz"
TREE = CACHE / f"vllm-{VERSION}"
PLUGIN_DIR = REPO / "testkit" / "upstream_plugin"
HF_HOME = CACHE / "hf_home"
# Models upstream's unit tests build configs from (shapes only, no weights): a local stand-in in a Hugging Face
# cache, since no hub is reachable. facebook/opt-125m: transformers' OPTConfig defaults are its shapes
# (768 hidden, 12 layers, 12 heads, vocab 50272, 2048 positions).
STAND_IN_CONFIGS = {"facebook/opt-125m": ("OPTConfig", "OPTForCausalLM")}


class Area(NamedTuple):
    """Upstream test files (or folders) and the patches whose wrapped code they exercise."""

    paths: list[str]
    patches: tuple[str, ...]


# Patches whose changed code no upstream unit test runs on this CPU host, each with why and what covers it instead
# (a test checks that every patch is in an area or here, and in only one of the two).
NO_AREA = {
    "fuzz_layer": "its changed code runs only in an engine serving a model: the worker's load and warm-up "
    "(upstream's model-runner tests need CUDA) and the frontend's first task lookup (upstream's AsyncLLM and "
    "LLMEngine tests load a model from the hub); covered by tests/test_fuzz_matrix.py, tests/test_openai_server.py "
    "and python -m patches.matrix",
}

# The patched areas. Every patch in patches.framework.catalogue.PATCH_MODULES is exercised by at least one, or named
# in NO_AREA with why: a test checks.
AREAS = {
    "metrics stats": Area(["tests/v1/metrics/test_stats.py"], ("accounting",)),
    "invalid blocks": Area(
        ["tests/v1/kv_connector/unit/test_invalid_blocks_correctness.py"], ("accounting", "kv_faults")
    ),
    "KV load failure recovery": Area(
        ["tests/v1/kv_connector/unit/test_kv_load_failure_recovery.py"], ("accounting", "kv_faults")
    ),
    "offloading connector": Area(
        ["tests/v1/kv_connector/unit/offloading_connector", "tests/v1/kv_connector/unit/test_offloading_connector.py"],
        ("kv_faults", "cpu_offload"),
    ),
    "CPU offload spec": Area(["tests/v1/kv_offload/cpu", "tests/v1/kv_offload/test_factory.py"], ("cpu_offload",)),
    # fuzz: Request.__init__ (the cache salt)
    "scheduler": Area(["tests/v1/core/test_scheduler.py"], ("accounting", "fuzz")),
    # fuzz: InputProcessor._validate_params
    "input processor": Area(
        ["tests/v1/engine/test_input_processor_trace_replay.py", "tests/test_request_input_bounds.py"], ("fuzz",)
    ),
    # cpu_inproc: CoreEngineProcManager.__init__, CpuPlatform.check_and_update_config
    "engine launch": Area(
        [
            "tests/v1/engine/test_startup_watch_processes.py",
            "tests/v1/executor/test_executor.py",
            "tests/platforms/test_cpu.py",
        ],
        ("cpu_inproc",),
    ),
    # shm_wait: SpinCondition.wait
    "shared-memory broadcast": Area(["tests/distributed/test_shm_broadcast.py"], ("shm_wait",)),
    # stats_thread: AsyncLLM._run_output_handler, AsyncLLM.shutdown, the StatLoggerManager's class
    "async engine stat loggers": Area(
        ["tests/v1/metrics/test_engine_logger_apis.py", "tests/v1/metrics/test_ray_metrics.py"], ("stats_thread",)
    ),
    # inline_render: BaseRenderer.render_cmpl_async / render_chat_async, HfRenderer._render_with_timeout
    "renderer": Area(
        [
            "tests/renderers/test_completions.py",
            "tests/renderers/test_hf.py",
            "tests/renderers/test_executor_replace.py",
        ],
        ("inline_render",),
    ),
    # early_submit: OpenAIServingCompletion.create_completion, OpenAIServingChat.create_chat_completion
    "OpenAI serving": Area(
        [
            # the 0.32.0 sdist's tests that build OpenAIServingCompletion / OpenAIServingChat
            "tests/entrypoints/openai/completion/test_completion_error.py",
            "tests/entrypoints/openai/completion/test_completion_text_offset.py",
            "tests/entrypoints/openai/chat_completion/test_serving_chat.py",
            "tests/entrypoints/openai/chat_completion/test_chat_error.py",
        ],
        ("early_submit",),
    ),
}

# Tests whose outcome the patches change on purpose: test id -> the patch behaviour that explains it.
DELIBERATE: dict[str, str] = {}

# Failures that say "this host cannot run it", the same with patches on and off.
HOST_REASONS = [
    (re.compile(r"CUDA|is_cuda|torch\.cuda|cuda:\d|NVIDIA|nvml|GPU", re.S), "needs a GPU"),
    (re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'"), "needs the package {0}"),
    (
        re.compile(
            r"(LocalEntryNotFoundError|OfflineModeIsEnabled|HF_HUB_OFFLINE|huggingface\.co|"
            r"Repo id must|does not appear to have a file|is not a local folder|"
            r"Invalid repository ID or local directory)",
            re.S,
        ),
        "needs a model from the Hugging Face hub (offline here)",
    ),
    (
        re.compile(r"Unsupported CPU attention|not supported on CPU|CPU platform|current_platform", re.S),
        "not supported on the CPU platform",
    ),
]


def ensure_tree() -> Path:
    """The unpacked sdist's tests (fetched with pip on first use)."""
    if not (TREE / "tests").is_dir():
        if not SDIST.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            print(f"fetching the vllm=={VERSION} sdist (upstream's tests) into {CACHE} ...", flush=True)
            # The metadata step builds nothing with these two (the sdist's setup.py would otherwise
            # want a CUDA toolchain and call the version 0.32.0+empty).
            env = {**os.environ, "VLLM_TARGET_DEVICE": "empty", "VLLM_VERSION_OVERRIDE": VERSION}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    f"vllm=={VERSION}",
                    "--no-deps",
                    "--no-binary",
                    "vllm",
                    "-d",
                    str(CACHE),
                ],
                check=True,
                env=env,
            )
        with tarfile.open(SDIST) as tar:
            members = [
                m
                for m in tar.getmembers()
                if m.name.startswith(f"vllm-{VERSION}/tests/") or m.name == f"vllm-{VERSION}/pyproject.toml"
            ]
            tar.extractall(CACHE, members=members, filter="data")
    return TREE


def ensure_stand_in_configs() -> Path:
    """An offline Hugging Face cache holding only the config.json of each model in STAND_IN_CONFIGS."""
    import json

    import transformers

    for repo, (config_cls, arch) in STAND_IN_CONFIGS.items():
        hub = HF_HOME / "hub" / f"models--{repo.replace('/', '--')}"
        snapshot = hub / "snapshots" / ("0" * 40)
        if (snapshot / "config.json").exists():
            continue
        snapshot.mkdir(parents=True, exist_ok=True)
        (hub / "refs").mkdir(exist_ok=True)
        (hub / "refs" / "main").write_text("0" * 40)
        config = getattr(transformers, config_cls)().to_dict() | {"architectures": [arch], "torch_dtype": "float16"}
        (snapshot / "config.json").write_text(json.dumps(config, indent=1))
    return HF_HOME


def run_once(tree: Path, paths: list[str], off: str, junit: Path, timeout: float) -> dict[str, tuple[str, str]]:
    """Run ``paths`` in a pytest subprocess with FUZZSERVE_PATCHES_OFF=``off`` (and the opt-in patches opted in:
    what is on meets upstream's tests); test id -> (outcome, message)."""
    env = {
        **os.environ,
        OFF_ENV: off,
        STATS_THREAD_ENV: "1",
        EARLY_SUBMIT_ENV: "1",
        HF_HUB_OFFLINE: "1",
        "HF_HOME": str(HF_HOME),
        "PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), str(REPO), str(tree)]),
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "--rootdir",
        str(tree),
        "-c",
        str(tree / "pyproject.toml"),
        "-p",
        "fuzzserve_upstream",
        "-p",
        "no:cacheprovider",
        "-q",
        # a module that cannot be imported here (a package upstream's tests need and this host lacks) is reported
        # as its own error row; without this, pytest stops the whole area on it and its other modules never run
        "--continue-on-collection-errors",
        "--timeout",
        "300",
        f"--junitxml={junit}",
        "-o",
        "junit_family=xunit1",
    ]
    # on a timeout, whatever the XML holds (nothing: every test of the area reads "missing")
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(cmd, cwd=tree, env=env, timeout=timeout, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return read_junit(junit) if junit.exists() else {}


def read_junit(path: Path) -> dict[str, tuple[str, str]]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        tid = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = f"{el.get('message') or ''}\n{el.text or ''}"
                break
        out[tid] = (outcome, message)
    return out


def node_id(tree: Path, test: str) -> str:
    """``tests.v1.a.test_b.TestC::test_d[x]`` (JUnit's class name) -> ``tests/v1/a/test_b.py::TestC::test_d[x]``."""
    classname, name = test.split("::", 1)
    parts = classname.split(".")
    for i in range(len(parts), 0, -1):
        path = Path(*parts[:i]).with_suffix(".py")
        if (tree / path).exists():
            return "::".join([str(path), *parts[i:], name])
    return test


def rerun_differences(tree: Path, rows: list[dict[str, str]], area: str, timeout: float) -> None:
    """Run each test whose outcome differed again, both ways: a difference that does not repeat is a flaky
    test of this (busy, 2-core) host, not a patch; one that repeats stands."""
    differing = [r for r in rows if r["verdict"] == "DIFFERS"]
    if not differing:
        return
    ids = [node_id(tree, r["test"]) for r in differing]
    again = {
        way: run_once(tree, ids, off, CACHE / f"junit-{area.replace(' ', '_')}-{way}-rerun.xml", timeout)
        for way, off in (("on", ""), ("off", "all"))
    }
    for r in differing:
        on, off = again["on"].get(r["test"], ("missing", ""))[0], again["off"].get(r["test"], ("missing", ""))[0]
        if on == off:
            r["verdict"] = "flaky"
            r["note"] = (
                f"differed once (on: {r['on']}, off: {r['off']}), the same on a rerun (both {on}): {r['note'][:200]}"
            )


def host_reason(message: str) -> str | None:
    for pattern, reason in HOST_REASONS:
        m = pattern.search(message)
        if m:
            return reason.format(*m.groups())
    return None


def compare(on: dict[str, tuple[str, str]], off: dict[str, tuple[str, str]]) -> list[dict[str, str]]:
    """One row per test: its outcome with patches on and off, and the verdict."""
    rows = []
    for tid in sorted(set(on) | set(off)):
        (o_on, m_on), (o_off, m_off) = on.get(tid, ("missing", "")), off.get(tid, ("missing", ""))
        if o_on != o_off:
            verdict = "deliberate" if tid in DELIBERATE else "DIFFERS"
            note = DELIBERATE.get(tid) or (m_on if o_on not in ("passed", "missing") else m_off).strip()[:300]
        elif o_on == "passed":
            verdict, note = "passed", ""
        elif o_on == "skipped":
            verdict, note = "not applicable", f"skipped upstream: {m_on.strip()[:120]}"
        else:
            reason = host_reason(m_on)
            verdict = "not applicable" if reason else "fails both ways"
            note = reason or m_on.strip()[:300]
        rows.append({"test": tid, "on": o_on, "off": o_off, "verdict": verdict, "note": note})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--areas", default=",".join(AREAS), help="comma-separated subset of: " + ", ".join(AREAS))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per area and way")
    ap.add_argument("--list", action="store_true", help="print the test paths and exit")
    ap.add_argument("--out", type=Path, default=CACHE / "report.md")
    args = ap.parse_args(argv)
    areas = [a.strip() for a in args.areas.split(",") if a.strip()]
    unknown = [a for a in areas if a not in AREAS]
    if unknown:
        ap.error(f"unknown areas {unknown}")
    if args.list:
        print("\n".join(p for a in areas for p in AREAS[a].paths))
        return 0
    import vllm

    if vllm.__version__.split("+")[0] != VERSION:
        print(f"installed vllm is {vllm.__version__}; these are {VERSION}'s tests", file=sys.stderr)
        return 2
    # tblib: upstream's tests/conftest.py imports it; multiprocess: its shared-memory broadcast tests do.
    # Both are in the `test` extra: missing, an area would only look "not applicable".
    missing = [m for m in ("tblib", "multiprocess") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"upstream's tests need {', '.join(missing)} (the `test` extra: scripts/bootstrap.sh installs it)",
            file=sys.stderr,
        )
        return 2
    tree = ensure_tree()
    absent = [path for area in areas for path in AREAS[area].paths if not (tree / path).exists()]
    if absent:  # pytest would collect nothing from them and the area would look clean
        print(f"not in the {VERSION} sdist's tests: {', '.join(absent)}", file=sys.stderr)
        return 2
    ensure_stand_in_configs()
    rows = []
    for area in areas:
        results = {}
        for way, off in (("on", ""), ("off", "all")):
            print(f"{area}: patches {way} ...", flush=True)
            results[way] = run_once(
                tree, AREAS[area].paths, off, CACHE / f"junit-{area.replace(' ', '_')}-{way}.xml", args.timeout
            )
        area_rows = [r | {"area": area} for r in compare(results["on"], results["off"])]
        rerun_differences(tree, area_rows, area, args.timeout)
        rows += area_rows
    stale = sorted(set(DELIBERATE) - {r["test"] for r in rows if r["verdict"] == "deliberate"})
    write_report(args.out, rows, stale)
    tally = Counter(r["verdict"] for r in rows)
    print(f"{len(rows)} upstream tests: " + ", ".join(f"{v} {n}" for v, n in sorted(tally.items())))
    for r in rows:
        if r["verdict"] in ("DIFFERS", "deliberate"):
            print(f"  {r['verdict']}: {r['test']} (on: {r['on']}, off: {r['off']}) {r['note'][:200]}")
    for tid in stale:
        print(f"  listed as a deliberate difference but the same both ways now: {tid}")
    print(f"report: {args.out}")
    return 1 if tally["DIFFERS"] or stale or not rows else 0


def write_report(path: Path, rows: list[dict[str, str]], stale: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Upstream vLLM 0.32.0 unit tests, patches on vs off",
        "",
        "| area | test | patches on | patches off | verdict | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        note = r["note"].replace("|", "/").replace("\n", " ")[:200]
        lines.append(f"| {r['area']} | `{r['test']}` | {r['on']} | {r['off']} | {r['verdict']} | {note} |")
    lines += ["", f"Listed as deliberate but no longer different: {stale or 'none'}", ""]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
