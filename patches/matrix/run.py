"""Run one architecture of the fuzz matrix: build its model, serve the mixed batch in vLLM, judge against the reference.

:func:`run_architecture` is what the CLI (``python -m patches.matrix``) and
the tests call. The engine runs in a child process
(:mod:`patches.matrix.engine_run`, its own process group, killed on
timeout); the reference runs here, after the engine has exited, so the two
never share the 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .architectures import ARCHITECTURES, INIT_RANGE, LAYERS, WORDS, build, build_tokenizer, resolved_backend
from .judge import CaseVerdict, judge, refusal, rejudge
from .reference import Fuzz, Reference

log = logging.getLogger(__name__)

MODES = ("eager", "compiled")
MAX_TOKENS = 8
PROMPT_WORDS = (300, 280, 260, 240)  # over two KV blocks of 128 tokens each: the second pass reads them from the cache
SHARED_PREFIX = 150  # prompts 0 and 1 share their first 150 words (a whole block, under one salt per setting)
# Every prompt under each setting, all in one batch: scale mode's whole range, gaussian mode at two strengths and seeds
# on the input embeddings (what the matrix proved before fuzz reached deeper), then every depth the matrix asks for
# (settings_for) under each scope and a ramp.
EMBEDDING_SETTINGS: tuple[Fuzz, ...] = (
    Fuzz(),
    Fuzz(0.0),
    Fuzz(0.5),
    Fuzz(0.9),
    Fuzz(1.0),
    Fuzz(0.5, "gaussian", seed=1),
    Fuzz(1.0, "gaussian", seed=-7),
)
SCOPES = ("all", "prompt", "generated")


def depths(num_layers: int) -> tuple[int, ...]:
    """The ``fuzz_layer`` values the matrix tries: the embeddings, the first layer, the middle one and the last
    (counted from the end), each once."""
    return tuple(dict.fromkeys((0, 1, num_layers // 2, -1)))


def settings_for(num_layers: int) -> tuple[Fuzz, ...]:
    """Every setting of the mixed batch for a model of ``num_layers`` decoder layers: the embedding settings, then
    at each depth each scope in scale (0.5) and gaussian (1.0, seed 11) mode, and a ramp in each mode (scale 0 to 1,
    gaussian 0.25 to 2, over 4 generated tokens)."""
    out = list(EMBEDDING_SETTINGS)
    for layer in depths(num_layers):
        for tokens in SCOPES:
            out.append(Fuzz(0.5, layer=layer, tokens=tokens))
            out.append(Fuzz(1.0, "gaussian", seed=11, layer=layer, tokens=tokens))
        out.append(Fuzz(0.0, layer=layer, end=1.0, ramp=4))
        out.append(Fuzz(0.25, "gaussian", seed=5, layer=layer, end=2.0, ramp=4))
    return tuple(dict.fromkeys(out))  # Fuzz(0.5) at layer 0, all tokens, is an embedding setting already


SETTINGS = settings_for(LAYERS)
# The engine inherits this process's environment: the project's engine environment (scripts/env.sh exports it: no
# model hub, the CPU KV cache size; serve_app/engine/engine_env.py is its home, which the plugin package may not
# import).
# VLLM_ALLOW_INSECURE_SERIALIZATION: collective_rpc ships worker_stats, a function, to the engine (a local child).
ENGINE_ENV = {"TOKENIZERS_PARALLELISM": "false", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
START_TIMEOUT_S = 900


class EngineRefused(RuntimeError):
    """The engine did not serve the batch (start-up refused or crashed): its log's last lines say why."""


@dataclass
class ArchitectureResult:
    """One architecture in one mode: every request's verdict, or why the engine refused."""

    name: str
    mode: str
    backend: str
    expected_backend: str
    patches_off: str = ""
    layer_offset: int = 0  # the reference's planted off-by-one (the control); 0 in a real run
    cases: list[CaseVerdict] = field(default_factory=list)
    tokens_fuzzed: int = 0
    refused: str = ""  # the engine's reason, where it did not serve
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            not self.refused
            and self.backend == self.expected_backend
            and bool(self.cases)
            and all(c.ok for c in self.cases)
            and self.tokens_fuzzed > 0
            and all(c.cached_tokens > 0 for c in self.cases)
        )

    def counts(self) -> dict[str, int]:
        out = {"equal": 0, "near-tie": 0, "float-noise": 0, "differs": 0, "refused": 0}
        for c in self.cases:
            out[c.verdict] += 1
        return out

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "mode": self.mode,
            "backend": self.backend,
            "expected_backend": self.expected_backend,
            "patches_off": self.patches_off,
            "layer_offset": self.layer_offset,
            "ok": self.ok,
            "counts": self.counts(),
            "tokens_fuzzed": self.tokens_fuzzed,
            "refused": self.refused,
            "seconds": round(self.seconds, 1),
            "cases": [vars(c) | {"ok": c.ok} for c in self.cases],
        }


def prompts() -> list[list[int]]:
    """The matrix's prompts as token ids: words of the fixture vocabulary, fixed seed, two sharing a prefix.

    Encoded with the matrix's tokenizer itself, which every matrix
    checkpoint carries (``AutoTokenizer`` would pick a family's own tokenizer
    class for some model types, Qwen2's among them, and read other ids).
    """
    rng = random.Random(1234)
    words = [[rng.choice(WORDS) for _ in range(n)] for n in PROMPT_WORDS]
    words[1][:SHARED_PREFIX] = words[0][:SHARED_PREFIX]
    tokenizer = build_tokenizer()
    ids = [tokenizer.encode(" ".join(w)) for w in words]
    assert all(len(x) == n + 1 for x, n in zip(ids, PROMPT_WORDS, strict=True)), "one token per word, after BOS"
    return ids


def _run_engine(job: dict, env: dict[str, str], workdir: Path, timeout: float) -> dict:
    job_file, out_file, log_file = workdir / "job.json", workdir / "out.json", workdir / "engine.log"
    job_file.write_text(json.dumps(job))
    cmd = [sys.executable, "-m", "patches.matrix.engine_run", str(job_file), str(out_file)]
    with open(log_file, "wb") as logf:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise EngineRefused(f"no answer within {timeout:.0f} s; log: {log_file}") from None
        finally:
            with contextlib.suppress(ProcessLookupError):  # what the engine left behind, by its process group
                os.killpg(proc.pid, signal.SIGKILL)
    if rc != 0 or not out_file.exists():
        tail = log_file.read_text(errors="replace").strip().splitlines()[-30:]
        reason = next((ln for ln in reversed(tail) if "Error" in ln or "refus" in ln), tail[-1] if tail else "")
        raise EngineRefused(f"exit {rc}: {reason.strip()} (log: {log_file})")
    return json.loads(out_file.read_text())


def cases_of(n_prompts: int) -> list[tuple[int, Fuzz]]:
    """The requests of the mixed batch: every prompt under every setting."""
    return [(p, f) for f in SETTINGS for p in range(n_prompts)]


def serve(
    model_path: Path,
    mode: str,
    ids: list[list[int]],
    patches_off: str = "",
    setup: str = "",
    env: dict[str, str] | None = None,
    workdir: Path | None = None,
    timeout: float = START_TIMEOUT_S,
) -> dict:
    """The engine's side: the mixed batch of :func:`cases_of` served twice by vLLM in a child process.

    Returns :mod:`patches.matrix.engine_run`'s output; raises
    :class:`EngineRefused` with the engine's reason where it did not serve.
    """
    from patches.framework.switches import OFF_ENV

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    cases = cases_of(len(ids))
    job = {
        "model": str(model_path),
        "mode": mode,
        "prompts": ids,
        "cases": [{"prompt": p, "xargs": f.xargs()} for p, f in cases],
        "max_tokens": MAX_TOKENS,
        "passes": 2,
        "max_model_len": 1024,
        "max_num_seqs": len(cases),
        "setup": setup,
    }
    engine_env = {**ENGINE_ENV, **(env or {})}
    if patches_off:
        engine_env[OFF_ENV] = patches_off
    with tempfile.TemporaryDirectory(prefix=f"fuzz-matrix-{mode}-") as tmp:
        work = workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        engine_env["VLLM_CACHE_ROOT"] = str(work / "vllm-cache")  # nothing compiled elsewhere is reused
        return _run_engine(job, engine_env, work, timeout)


@dataclass
class Served:
    """What one engine of the matrix produced (or why it refused), ready to be judged against a reference."""

    name: str
    mode: str
    path: Path
    ids: list[list[int]]
    patches_off: str = ""
    out: dict | None = None  # patches.matrix.engine_run's output
    refused: str = ""
    seconds: float = 0.0


def serve_architecture(
    name: str,
    mode: str = "eager",
    patches_off: str = "",
    workdir: Path | None = None,
    timeout: float = START_TIMEOUT_S,
    init_range: float = INIT_RANGE,
) -> Served:
    """Build architecture ``name``'s checkpoint and serve its mixed batch in vLLM (``mode``: eager or compiled)."""
    started = time.monotonic()
    path = build(name, init_range)
    served = Served(name, mode, path, prompts(), patches_off)
    try:
        served.out = serve(path, mode, served.ids, patches_off=patches_off, workdir=workdir, timeout=timeout)
    except EngineRefused as e:
        served.refused = str(e)
    served.seconds = time.monotonic() - started
    return served


def judge_served(served: Served, layer_offset: int = 0) -> ArchitectureResult:
    """Judge every request an engine served against the reference (the reference ``layer_offset`` layers off
    the requested one: the planted off-by-one control, where every layer case must come out ``differs``)."""
    started = time.monotonic()
    arch = ARCHITECTURES[served.name]
    result = ArchitectureResult(
        served.name, served.mode, resolved_backend(served.path), arch.backend, served.patches_off, layer_offset
    )
    if served.out is None:
        result.refused = served.refused
        result.seconds = served.seconds
        return result
    first, second = served.out["passes"]
    result.tokens_fuzzed = sum(w.get("tokens_fuzzed", 0) for w in served.out["worker"])
    ref = Reference(str(served.path), arch.layers, layer_offset)
    ref64: Reference | None = None  # the float64 reference, built for the first request beyond ATOL with equal tokens
    ids = served.ids
    for (p, fuzz), a, b in zip(cases_of(len(ids)), first, second, strict=True):
        label = f"prompt {p} {fuzz.label}"
        if "refused" in a:
            result.cases.append(refusal(label, a["refused"]))
            continue
        forced_lp, forced_best = ref.forced(ids[p], a["tokens"], fuzz)
        verdict = judge(
            label,
            a["tokens"],
            a["logprobs"],
            ref.greedy(ids[p], fuzz, MAX_TOKENS),
            forced_lp,
            forced_best,
            b["tokens"],
            b["cached"],
        )
        if verdict.float_noise_candidate:
            ref64 = ref64 or Reference(str(served.path), arch.layers, layer_offset, double=True)
            verdict = rejudge(verdict, a["logprobs"], forced_lp, ref64.forced(ids[p], a["tokens"], fuzz)[0])
        result.cases.append(verdict)
    result.seconds = served.seconds + time.monotonic() - started
    return result


def run_architecture(
    name: str,
    mode: str = "eager",
    patches_off: str = "",
    workdir: Path | None = None,
    timeout: float = START_TIMEOUT_S,
    init_range: float = INIT_RANGE,
    layer_offset: int = 0,
) -> ArchitectureResult:
    """Serve architecture ``name``'s mixed batch in vLLM (``mode``: eager or compiled) and judge every request.

    ``patches_off``: a value for ``FUZZSERVE_PATCHES_OFF`` in the engine (the
    matrix's negative controls: with ``fuzz`` off, the fuzzed requests must
    come out ``differs``; with ``fuzz_layer`` off, the deeper ones refused).
    ``layer_offset``: see :func:`judge_served`. ``init_range``: the random
    weights' scale (the families' default, 0.02, gives nearly flat logits and
    so near-ties).
    """
    served = serve_architecture(name, mode, patches_off, workdir, timeout, init_range)
    return judge_served(served, layer_offset)
