"""What the headline benchmark (:mod:`benchmarks.vs_vllm`) sends: the workload and every prompt set of a run.

A :class:`Workload` names each measured run of a phase (its label and requests
in flight) and the warm-up before them; :func:`prompt_plan` hands every pair
its prompt sets from one :class:`~benchmarks.harness.prompts.PromptBook`, so
that both arms of a pair send identical requests and no set shares a prompt
with another (checked, not assumed). The reuse workload's working sets are
sized against the local KV pool a replica has (:func:`local_pool_tokens`),
which plain vLLM gets too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import client_priority
from benchmarks.harness.arms import ProtocolError
from benchmarks.harness.prompts import BLOCK_TOKENS, PromptBook, PromptSet, check_disjoint
from serve_app.config import deploy_config
from serve_app.config.deploy_config import ServeConfig
from serve_app.engine.engine_env import ENGINE_ENV, KV_CACHE_SPACE

CHAT_PREFIX = "chat"  # a chat run's label: "chat8" (vLLM's bench backend openai-chat, /v1/chat/completions)


@dataclass
class Workload:
    """What every phase sends: a warm-up, then one run per label, each from prompts no other run shares."""

    name: str = "cold"
    input_len: int = 128  # tokens per prompt, BOS included (cold)
    output_len: int = 64
    # cold: prompts per run by requests in flight (about 15-20 s per run here)
    requests: dict[int, int] = field(default_factory=lambda: {1: 128, 8: 400, 32: 800, 128: 1280})
    # cold: chat completions, prompts per run by requests in flight (labels chat8, chat32)
    chat: dict[int, int] = field(default_factory=lambda: {8: 400, 32: 800})
    warmup_prompts: int = 300
    # reuse: working sets as multiples of the local KV pool, visited `rounds` times at `reuse_concurrency`
    working_sets: tuple[float, ...] = (0.5, 1.5)
    prefix_blocks: int = 7
    suffix_tokens: int = 32
    rounds: int = 2
    reuse_concurrency: int = 32
    # measured runs: requests per second offered (vLLM's bench: Poisson arrivals from its fixed seed, the same
    # schedule for every arm), the requests in flight still capped; None = vLLM's default, all at once
    request_rate: float | None = None
    # the client's CPU scheduling (benchmarks.harness.client_priority): fifo, so that no arm's spinning threads
    # starve the client and its own wait is read as the server's latency; normal, the old way
    client_sched: str = client_priority.FIFO

    def runs(self) -> list[tuple[str, int]]:
        """(label, requests in flight) of each measured run, in order."""
        if self.name == "cold":
            return [(f"c{c}", c) for c in sorted(self.requests)] + [(f"{CHAT_PREFIX}{c}", c) for c in sorted(self.chat)]
        return [(f"ws{w:g}x", self.reuse_concurrency) for w in self.working_sets]


def is_chat(label: str) -> bool:
    """Whether a run label is a chat completions run."""
    return label.startswith(CHAT_PREFIX)


def parse_requests(text: str) -> dict[int, int]:
    """``"1:128,8:400"`` -> {1: 128, 8: 400}."""
    out: dict[int, int] = {}
    for part in text.split(","):
        c, n = part.split(":")
        out[int(c)] = int(n)
    return out


def kv_bytes_per_token(model: Path, dtype_bytes: int = 4) -> int:
    """KV cache bytes one token takes in every layer of the model (K and V)."""
    cfg = json.loads((Path(model) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return (
        2
        * cfg["num_hidden_layers"]
        * cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        * head_dim
        * dtype_bytes
    )


def local_pool_tokens(config: ServeConfig, model: Path) -> int:
    """Tokens the local KV pool of a replica holds (``VLLM_CPU_KVCACHE_SPACE`` GiB; plain vLLM gets the same)."""
    gib = int(deploy_config.application(config).env_vars.get(KV_CACHE_SPACE, ENGINE_ENV[KV_CACHE_SPACE]))
    return gib * 2**30 // kv_bytes_per_token(model)


def prompt_plan(workload: Workload, pairs: int, seed: int, pool_tokens: int) -> dict[tuple[int, str], PromptSet]:
    """Every prompt set of the benchmark, from one book: (pair, "warmup" or a run label) -> its set.

    Both arms of a pair send the same sets (identical requests); no set shares a prompt with another."""
    book = PromptBook(seed)
    plan: dict[tuple[int, str], PromptSet] = {}
    for p in range(pairs):
        plan[p, "warmup"] = book.unique(f"pair{p}-warmup", workload.warmup_prompts, workload.input_len)
        for label, c in workload.runs():
            if workload.name == "cold":
                n = workload.chat[c] if is_chat(label) else workload.requests[c]
                plan[p, label] = book.unique(f"pair{p}-{label}", n, workload.input_len)
            else:
                w = float(label[2:-1])
                prefixes = max(1, round(w * pool_tokens / (workload.prefix_blocks * BLOCK_TOKENS)))
                plan[p, label] = book.reuse(
                    f"pair{p}-{label}", prefixes, workload.prefix_blocks, workload.suffix_tokens, workload.rounds
                )
    problems = check_disjoint(plan.values())
    if problems:
        raise ProtocolError("prompt sets overlap: " + "; ".join(problems))
    return plan
