"""What the load generator sends: a configurable mix of requests, drawn reproducibly.

Every request is a :class:`RequestSpec` (an HTTP body plus what the client
will do with it and what it expects). :class:`Mix` says how often each kind
appears; :func:`draw` turns (mix, seed, index) into a spec, so a run is
reproducible and a spec can be re-created from its index.

The kinds and why each is there:

* fuzz levels: s = 0 and a log-spaced sweep from 1 to 10, in both
  modes (every level gets its own KV cache salt in the engine); a share of the
  fuzzed requests at a decoder layer (``fuzz_layer`` 1 or -1, valid on any
  model), and a share with a ``fuzz_tokens`` scope or a ramp (their KV salted
  with the prompt length too);
* long shared prefixes: a few multi-block (128-token blocks on CPU) prefixes
  shared by many requests, so the prefix cache and the offload tier are hit,
  evicted and reloaded;
* long prompts: near the context limit, unique, so the KV pool runs short
  and requests preempt each other;
* streaming and non-streaming, completions and chat;
* client cancellation mid-stream (the engine must account aborted requests);
* deliberately bad requests, each with the 4xx and the field it must name.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fixture_model.tasks import held_out_examples, training_examples
from serve_app.ingress.xargs_policy import prompt_count

from .hostile import HOSTILE_SETS, HostileSet

# The load's fuzz levels: 0, then 10 log-spaced strengths from 1 to 10 (the fuzz sweep's gaussian levels too:
# load_tests.load.fuzz_sweep).
LOG_SWEEP = [0.0] + [round(float(x), 3) for x in np.logspace(0, 1, 10)]
FUZZ_LEVELS = LOG_SWEEP
MODES = ("scale", "gaussian")


class Mix(BaseModel):
    """Shares of each request kind (each in [0, 1]; independent draws per request)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fuzz: float = Field(0.6, ge=0, le=1, description="share of requests with a non-zero fuzz strength")
    gaussian: float = Field(0.5, ge=0, le=1, description="share of fuzzed requests in gaussian mode")
    shared_prefix: float = Field(0.4, ge=0, le=1, description="share on a long shared prefix")
    long_prompt: float = Field(0.05, ge=0, le=1, description="share with a long unique prompt")
    stream: float = Field(0.7, ge=0, le=1)
    chat: float = Field(0.3, ge=0, le=1)
    cancel: float = Field(0.1, ge=0, le=1, description="share of streams the client drops mid-way")
    bad: float = Field(0.05, ge=0, le=1, description="share of deliberately bad requests (expect 4xx)")
    deep: float = Field(
        0.5,
        ge=0,
        le=1,
        description="share of fuzzed requests at a decoder layer (fuzz_layer 1 or -1) instead of the input embeddings",
    )
    scheduled: float = Field(
        0.3,
        ge=0,
        le=1,
        description="share of fuzzed requests with a fuzz_tokens scope (prompt or generated) or a ramp over the "
        "generated tokens",
    )
    hostile: float = Field(
        0.0,
        ge=0,
        le=1,
        description="share of hostile requests (load_tests.plan.hostile: "
        "coerced caps, prompt lists, limit headers, costly "
        "grammars; each expects its 400)",
    )
    hostile_requests: HostileSet = Field(
        "refused", description="which set the hostile share draws from (load_tests.plan.hostile.HOSTILE_SETS)"
    )
    n_prefixes: int = Field(6, ge=1)
    prefix_tokens: int = Field(600, ge=1, description="approximate length of each shared prefix")
    long_prompt_tokens: int = Field(900, ge=1)
    max_tokens: tuple[int, int] = (8, 48)
    prompt_tokens: int | None = Field(
        None,
        ge=1,
        description="every prompt exactly this many random tokens (one "
        "number word each), as vLLM bench's random dataset; None: the task prompts",
    )
    ignore_eos: bool = Field(False, description="answers run to max_tokens (vLLM's ignore_eos), for fixed lengths")
    explicit_zero: float = Field(
        0.5, ge=0, le=1, description="share of unfuzzed requests that send fuzz_strength 0 (which must equal no fuzz)"
    )
    prompts_file: str | None = Field(
        None,
        description="request i sends prompt prompts_offset + i of this vLLM "
        '`custom` dataset file (JSONL of {"prompt": ...}), none twice: the prompts '
        "vLLM's bench serve sends from the same file (benchmarks/bench_agreement.py)",
    )
    prompts_offset: int = Field(0, ge=0, description="the first prompt of prompts_file this run sends")
    bench_body: bool = Field(
        False,
        description="send the body vLLM's bench serve sends for a completion "
        "(adds its repetition_penalty 1.0 and logprobs null), so both clients' bodies are equal",
    )
    model: str = "fixture"

    @model_validator(mode="after")
    def _check(self) -> Mix:
        if self.max_tokens[0] < 1 or self.max_tokens[0] > self.max_tokens[1]:
            raise ValueError(f"max_tokens must be (lo, hi) with 1 <= lo <= hi, got {self.max_tokens}")
        return self


@dataclass
class RequestSpec:
    """One request: where it goes, its JSON body (or raw bytes), and what the client expects."""

    index: int
    route: str  # /v1/completions or /v1/chat/completions
    body: dict[str, Any] | None
    raw_body: bytes | None = None  # sent instead of body (malformed JSON)
    stream: bool = False
    cancel_after_chunks: int | None = None
    expect: Literal["ok", "4xx"] = "ok"
    expect_status: int | None = None
    expect_param: str | None = None  # the field the error must name
    tags: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # sent beside the target's own (the hostile requests')

    @property
    def engine_requests(self) -> int:
        """How many requests the engines count for this one if it is served: vLLM's OpenAI server makes one engine
        request per prompt of a completion's prompt list and per choice (``n``), so the clients-agree-with-the-
        engines check weighs each answer by this."""
        body = self.body or {}
        prompts = prompt_count(body["prompt"]) if "prompt" in body else 1  # as the guard and vLLM count them
        n = body.get("n", 1)
        return prompts * (n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("raw_body")
        d.pop("body")
        d["engine_requests"] = self.engine_requests
        return d

    def payload(self) -> bytes:
        return self.raw_body if self.raw_body is not None else json.dumps(self.body).encode()


@lru_cache(maxsize=8)
def shared_prefixes(n: int, tokens: int) -> tuple[str, ...]:
    """``n`` distinct prefixes of about ``tokens`` words each (one token per word), from the training tasks."""
    out = []
    ex = training_examples(n * (tokens // 8 + 8), seed=77)
    pos = 0
    for _ in range(n):
        words: list[str] = []
        while len(words) < tokens:
            words.extend(ex[pos].text.split())
            pos += 1
        out.append(" ".join(words[:tokens]))
    return tuple(out)


@lru_cache(maxsize=4)
def file_prompts(path: str) -> tuple[str, ...]:
    """The prompts of a vLLM ``custom`` dataset file, in order (read once per run)."""
    prompts = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f'{path}:{n}: not a {{"prompt": ...}} line: {e}') from e
    return tuple(prompts)


@lru_cache(maxsize=1)
def _tails():
    return tuple(held_out_examples(50, seed=4242))


# (body change, expected status, the field the error names)
BAD_REQUESTS: list[tuple[dict[str, Any] | bytes, int, str | None]] = [
    ({"vllm_xargs": {"fuzz_strength": -1}}, 400, "vllm_xargs.fuzz_strength"),
    ({"vllm_xargs": {"fuzz_strength": "strong"}}, 400, "vllm_xargs.fuzz_strength"),
    ({"vllm_xargs": {"fuzz_strength": 1e9}}, 400, "vllm_xargs.fuzz_strength"),
    ({"vllm_xargs": {"fuzz_strength": 1, "fuzz_mode": "chaotic"}}, 400, "vllm_xargs.fuzz_mode"),
    ({"vllm_xargs": {"fuzz_strength": 1, "fuzz_seed": 0.5}}, 400, "vllm_xargs.fuzz_seed"),
    ({"vllm_xargs": {"fuzz_strenght": 1}}, 400, "vllm_xargs.fuzz_strenght"),
    ({"vllm_xargs": {"fuzz_strength": 1, "fuzz_layer": 9999}}, 400, "vllm_xargs.fuzz_layer"),  # past the model's layers
    ({"vllm_xargs": {"fuzz_strength": 1, "fuzz_tokens": "output"}}, 400, "vllm_xargs.fuzz_tokens"),
    ({"vllm_xargs": {"fuzz_strength": 1, "fuzz_ramp_tokens": 4}}, 400, "vllm_xargs.fuzz_ramp_tokens"),
    ({"vllm_xargs": {"kv_transfer_params": {"do_remote_prefill": True}}}, 400, "vllm_xargs.kv_transfer_params"),
    ({"kv_transfer_params": {"do_remote_decode": True}}, 400, "kv_transfer_params"),
    (b'{"model": "fixture", "prompt": "count 1 2", ', 400, None),
    ({"max_tokens": -3}, 400, "max_tokens"),
]


def _depth_and_schedule(mix: Mix, rng: random.Random) -> dict[str, Any]:
    """The keys beyond strength, mode and seed of one fuzzed request: a layer (1 or -1), a scope or a ramp."""
    extra: dict[str, Any] = {}
    if rng.random() < mix.deep:
        extra["fuzz_layer"] = rng.choice((1, -1))
    if rng.random() < mix.scheduled:
        kind = rng.choice(("prompt", "generated", "ramp"))
        if kind == "ramp":
            extra.update(fuzz_strength_end=rng.choice(FUZZ_LEVELS), fuzz_ramp_tokens=rng.randrange(9))
        else:
            extra["fuzz_tokens"] = kind
    return extra


def draw(mix: Mix, seed: int, index: int) -> RequestSpec:
    """The ``index``-th request of a run seeded ``seed``.

    The steps below draw from one generator in a fixed order (hostile?, length, route, bad?, task, prompt,
    fuzz, stream): reordering them would change every request of every seeded run."""
    rng = random.Random(seed * 1_000_003 + index)
    if mix.hostile and rng.random() < mix.hostile:
        return _hostile(mix, rng, index)
    max_tokens = rng.randint(*mix.max_tokens)
    chat = rng.random() < mix.chat
    route = "/v1/chat/completions" if chat else "/v1/completions"
    if rng.random() < mix.bad:
        return _bad(mix, rng, index, route, chat)

    tail = _tails()[rng.randrange(len(_tails()))]
    tags: dict[str, Any] = {"kind": "chat" if chat else "completion", "task": tail.task}
    prompt = _prompt(mix, rng, index, tail.prompt, tags)

    body: dict[str, Any] = {"model": mix.model, "max_tokens": max_tokens, "temperature": 0}
    if mix.bench_body:  # as vLLM's client writes them (its --temperature is a float: 0.0, not 0)
        body.update(repetition_penalty=1.0, logprobs=None, temperature=0.0)
    if mix.ignore_eos:
        body["ignore_eos"] = True
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    _fuzz(mix, rng, seed, index, body, tags)

    stream = rng.random() < mix.stream
    cancel = None
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if rng.random() < mix.cancel and max_tokens > 2:
            cancel = rng.randint(1, max_tokens - 1)
    return RequestSpec(index, route, body, stream=stream, cancel_after_chunks=cancel, tags=tags)


def _hostile(mix: Mix, rng: random.Random, index: int) -> RequestSpec:
    """A request from the mix's hostile set (``--hostile-requests``), with the answer it must get."""
    hostile_set = HOSTILE_SETS[mix.hostile_requests]
    hostile_kind, h_change, h_headers, h_status, h_param = hostile_set[rng.randrange(len(hostile_set))]
    hostile_body = {"model": mix.model, "prompt": "count 1 2", "max_tokens": 4, **h_change}
    return RequestSpec(
        index,
        "/v1/completions",
        hostile_body,
        expect="ok" if h_status < 400 else "4xx",
        expect_status=h_status,
        expect_param=h_param,
        tags={"kind": "hostile", "hostile": hostile_kind},
        headers=dict(h_headers),
    )


def _bad(mix: Mix, rng: random.Random, index: int, route: str, chat: bool) -> RequestSpec:
    """A bad request (:data:`BAD_REQUESTS`): a wrong field, or a body that is not JSON; it must be refused."""
    change, status, param = BAD_REQUESTS[rng.randrange(len(BAD_REQUESTS))]
    base = {
        "model": mix.model,
        "max_tokens": 4,
        **({"messages": [{"role": "user", "content": "count 1 2"}]} if chat else {"prompt": "count 1 2"}),
    }
    if isinstance(change, bytes):
        return RequestSpec(
            index,
            route,
            None,
            raw_body=change,
            expect="4xx",
            expect_status=status,
            expect_param=param,
            tags={"kind": "bad", "bad": "malformed_json"},
        )
    return RequestSpec(
        index,
        route,
        {**base, **change},
        expect="4xx",
        expect_status=status,
        expect_param=param,
        tags={"kind": "bad", "bad": param},
    )


def _prompt(mix: Mix, rng: random.Random, index: int, task_prompt: str, tags: dict[str, Any]) -> str:
    """The request's prompt: from the prompts file, random numbers, or the task's prompt (alone, after filler or
    after a shared prefix); ``tags`` records which."""
    if mix.prompts_file is not None:
        prompts = file_prompts(mix.prompts_file)
        k = mix.prompts_offset + index
        if k >= len(prompts):
            raise ValueError(
                f"{mix.prompts_file} has {len(prompts)} prompts; request {index} would need prompt "
                f"{k} (prompts are never sent twice)"
            )
        tags.update(prompt="file", task=None)
        return prompts[k]
    if mix.prompt_tokens is not None:
        tags.update(prompt="random", task=None)
        return " ".join(str(rng.randrange(200)) for _ in range(mix.prompt_tokens))
    if rng.random() < mix.long_prompt:
        filler = [str(rng.randrange(200)) for _ in range(mix.long_prompt_tokens)]
        tags["prompt"] = "long"
        return f"{' '.join(filler)} {task_prompt}"
    if rng.random() < mix.shared_prefix:
        group = rng.randrange(mix.n_prefixes)
        tags["prompt"] = f"prefix{group}"
        return f"{shared_prefixes(mix.n_prefixes, mix.prefix_tokens)[group]} {task_prompt}"
    tags["prompt"] = "short"
    return task_prompt


def _fuzz(mix: Mix, rng: random.Random, seed: int, index: int, body: dict[str, Any], tags: dict[str, Any]) -> None:
    """Whether and how the request is fuzzed: its ``vllm_xargs`` into ``body``, the same in ``tags``."""
    if rng.random() < mix.fuzz:
        mode = "gaussian" if rng.random() < mix.gaussian else "scale"
        strength = rng.choice(FUZZ_LEVELS[1:])
        body["vllm_xargs"] = {"fuzz_strength": strength, "fuzz_mode": mode, "fuzz_seed": rng.randrange(4)}
        tags.update(fuzz_mode=mode, fuzz_strength=strength)
        # depth, scope and schedule from a stream of their own: every other draw of the request (and so of every
        # run seeded before these keys existed) stays what it was
        extra = _depth_and_schedule(mix, random.Random(f"depth:{seed}:{index}"))
        body["vllm_xargs"].update(extra)
        tags.update(fuzz_layer=extra.get("fuzz_layer", 0), fuzz_tokens=extra.get("fuzz_tokens", "all"))
        tags.update(fuzz_ramp="fuzz_strength_end" in extra)
    else:
        if rng.random() < mix.explicit_zero:  # s = 0 sent explicitly: must equal no fuzz at all
            body["vllm_xargs"] = {"fuzz_strength": 0.0}
        tags.update(fuzz_mode="none", fuzz_strength=0.0)
