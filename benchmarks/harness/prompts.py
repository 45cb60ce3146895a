"""Prompts for the benchmarks that cannot flatter either side: none repeats unless reuse is what is measured.

Why this exists: vLLM's ``random`` bench dataset builds each prompt as a
window over the tokenizer's vocabulary. On the fixture model's 239-token
vocabulary that gives at most ~235 distinct prompts, so a run of hundreds of
requests repeats prompts, a fixed ``--seed`` repeats them across runs, and a
warm-up with the same seed sends the measured prompts ahead of time. A
128-token prompt is exactly one CPU KV block: vLLM's local prefix cache never
serves a prompt's last token, so it cannot hit such a prompt, but the
offloading connector's lookup accepts the whole prompt. On that workload the
stack with offloading skipped prefills that plain vLLM ran, and the headline
flattered it (docs/results_log.md, 2026-11-26).

What it gives instead, through vLLM's own ``custom`` dataset (a JSONL file of
``{"prompt": ...}`` lines, sent in file order with ``--disable-shuffle
--no-oversample --skip-chat-template``):

* :meth:`PromptBook.unique`: prompts of random vocabulary words (one token
  each, so a prompt of ``n`` words is ``n + 1`` tokens with the BOS), no two
  of which share their first :data:`KEY_WORDS` words, within a set or across
  every set the same book hands out. Two prompts that differ in their first
  words share no KV block (a block's hash chains its parent's), so a cold run
  can hit neither tier.
* :meth:`PromptBook.reuse`: a working set of shared prefixes (each a whole
  number of KV blocks, so the local cache and the offload tier are judged on
  the same blocks), each request one prefix and a suffix of its own, the
  prefixes visited ``rounds`` times in a fresh shuffle per round: a cyclic
  pattern, which an LRU tier smaller than the working set misses entirely.

A book is built from one seed; every set it hands out is new to it, so a
benchmark that takes all its prompt sets (warm-ups included) from one book
sends no prompt twice except where a reuse set repeats its prefixes on
purpose. :func:`check_disjoint` says so of any sets, and the tests feed it
both kinds.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# Prompts are told apart by their first this many words: enough that two random ones never collide by chance
# (235 ** 16), and short enough to lie inside the first KV block (128 tokens on CPU).
KEY_WORDS = 16
BLOCK_TOKENS = 128  # the CPU backend's KV block (docs: ../shared FACTS, "Running vLLM on this CPU")


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """The fixture tokenizer's words, each one token (no special tokens, no ``<unk>``), in vocabulary order."""
    from fixture_model.tasks import WORDS

    return tuple(dict.fromkeys(WORDS))


def prompt_tokens(prompt: str) -> int:
    """Tokens of ``prompt`` as the server counts them: one per vocabulary word, plus the BOS."""
    return len(prompt.split()) + 1


@dataclass(frozen=True)
class PromptSet:
    """Prompts for one run, in the order they are sent."""

    name: str
    prompts: tuple[str, ...]
    kind: str  # "unique" or "reuse"
    # reuse sets: how many distinct prefixes, of how many tokens each (BOS included), visited how many times
    prefixes: int = 0
    prefix_tokens: int = 0
    rounds: int = 1

    def __len__(self) -> int:
        return len(self.prompts)

    def write_jsonl(self, path: Path) -> Path:
        """vLLM's ``custom`` dataset format: one ``{"prompt": ...}`` per line."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in self.prompts))
        return path

    @property
    def working_set_tokens(self) -> int:
        """KV the reused prefixes occupy, in tokens (0 for a unique set)."""
        return self.prefixes * self.prefix_tokens

    def describe(self) -> dict[str, int | str]:
        return {
            "name": self.name,
            "kind": self.kind,
            "requests": len(self.prompts),
            "prompt_tokens": prompt_tokens(self.prompts[0]) if self.prompts else 0,
            "prefixes": self.prefixes,
            "prefix_tokens": self.prefix_tokens,
            "rounds": self.rounds,
            "working_set_tokens": self.working_set_tokens,
        }


def read_jsonl(path: Path) -> tuple[str, ...]:
    """The prompts of a ``custom`` dataset file, in order (the load generator's reader: one format, one parser)."""
    from load_tests.plan.workload import file_prompts

    return file_prompts(str(path))


class PromptBook:
    """Hands out prompt sets none of which shares a prompt (by its first :data:`KEY_WORDS` words) with another.

    ``seed`` makes the whole book reproducible; two books with different
    seeds are independent draws (not guaranteed disjoint: take every set of a
    benchmark from one book).
    """

    def __init__(self, seed: int, words: Sequence[str] | None = None):
        self.seed = seed
        self._rng = random.Random(seed)
        self._words = tuple(words if words is not None else vocabulary())
        if len(self._words) < 2:
            raise ValueError("a prompt book needs at least two words")
        self._keys: set[tuple[str, ...]] = set()

    def _fresh(self, n_words: int) -> list[str]:
        if n_words < KEY_WORDS:
            raise ValueError(f"prompts of {n_words} words: at least {KEY_WORDS} are needed to keep them apart")
        while True:
            words = self._rng.choices(self._words, k=n_words)
            key = tuple(words[:KEY_WORDS])
            if key not in self._keys:
                self._keys.add(key)
                return words

    def unique(self, name: str, n: int, tokens: int) -> PromptSet:
        """``n`` prompts of ``tokens`` tokens each (BOS included), each new to this book."""
        return PromptSet(name, tuple(" ".join(self._fresh(tokens - 1)) for _ in range(n)), "unique")

    def reuse(self, name: str, prefixes: int, prefix_blocks: int, suffix_tokens: int, rounds: int) -> PromptSet:
        """``prefixes`` shared prefixes of ``prefix_blocks`` whole KV blocks each (BOS included), each visited
        once per round in a fresh shuffle, ``rounds`` rounds; every request's suffix of ``suffix_tokens`` words
        is its own (so no request repeats another whole)."""
        if prefixes < 1 or prefix_blocks < 1 or rounds < 1 or suffix_tokens < 1:
            raise ValueError("reuse sets need at least one prefix, block, round and suffix token")
        heads = [self._fresh(prefix_blocks * BLOCK_TOKENS - 1) for _ in range(prefixes)]
        order: list[int] = []
        for _ in range(rounds):
            visit = list(range(prefixes))
            self._rng.shuffle(visit)
            order += visit
        prompts = tuple(" ".join(heads[i] + self._rng.choices(self._words, k=suffix_tokens)) for i in order)
        return PromptSet(
            name, prompts, "reuse", prefixes=prefixes, prefix_tokens=prefix_blocks * BLOCK_TOKENS, rounds=rounds
        )


def check_disjoint(sets: Iterable[PromptSet]) -> list[str]:
    """Every way the sets break "no prompt twice": a prompt (by its first words) repeated within a unique set, or
    shared between two sets. A reuse set's own prefixes repeat by design; across sets they must not. Empty: none."""
    problems = []
    owner: dict[tuple[str, ...], str] = {}
    for s in sets:
        keys = [tuple(p.split()[:KEY_WORDS]) for p in s.prompts]
        if s.kind == "unique" and len(set(keys)) != len(keys):
            problems.append(f"{s.name}: {len(keys) - len(set(keys))} prompt(s) repeat within the set")
        for key in dict.fromkeys(keys):
            if key in owner and owner[key] != s.name:
                problems.append(f"{s.name}: shares a prompt with {owner[key]}")
                break
            owner[key] = s.name
    return problems
