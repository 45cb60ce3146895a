"""The fixture model's vocabulary and its synthetic tasks.

Why synthetic tasks: no model hub is reachable, and "the fuzz patch changes
behaviour" must be measurable as *accuracy* on something whose right answer is
known, not only as "the bytes differ". Three tasks, each a prompt whose greedy
continuation is checkable:

* ``count``: ``count 37 38 39`` -> ``40 41 42 ...`` (numbers 0..NUM_MAX-1)
* ``abc``: ``abc k l m`` -> ``n o p ...`` (the alphabet, wrapping z -> a)
* ``copy``: ``copy q 4 x 9 =`` -> ``q 4 x 9`` (copy the items before ``=``)

Every example ends with ``.``, so the model learns to stop. Held-out prompts
come from a different random stream than the training examples.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

NUM_MAX = 200
LETTERS = list(string.ascii_lowercase)
NUMBERS = [str(i) for i in range(NUM_MAX)]
KEYWORDS = ["count", "abc", "copy", "=", ".", "user", "assistant", "system", ":"]
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
WORDS = KEYWORDS + LETTERS + NUMBERS
TASKS = ("count", "abc", "copy")
ANSWER_LEN = 6  # tokens of continuation that are checked


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str  # the expected continuation (space-separated words), without "."

    @property
    def text(self) -> str:
        return f"{self.prompt} {self.answer} ."


def make_example(rng: random.Random, task: str) -> Example:
    if task == "count":
        start = rng.randrange(0, NUM_MAX - 16)
        k = rng.randint(3, 8)
        seq = [str(start + i) for i in range(k + ANSWER_LEN)]
    elif task == "abc":
        start = rng.randrange(0, 26)
        k = rng.randint(3, 8)
        seq = [LETTERS[(start + i) % 26] for i in range(k + ANSWER_LEN)]
    elif task == "copy":
        pool = LETTERS + NUMBERS[:20]
        items = [rng.choice(pool) for _ in range(rng.randint(3, ANSWER_LEN))]
        return Example(task, f"copy {' '.join(items)} =", " ".join(items))
    else:
        raise ValueError(f"unknown task {task!r}")
    return Example(task, f"{task} {' '.join(seq[:k])}", " ".join(seq[k:]))


# Copying needs attention (an induction pattern) and is learned last; it gets
# half of the training mix, the two successor tasks a quarter each.
TRAINING_MIX = ("count", "copy", "abc", "copy")


def training_examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    return [make_example(rng, TRAINING_MIX[i % len(TRAINING_MIX)]) for i in range(n)]


def held_out_examples(n_per_task: int, seed: int = 10_000) -> list[Example]:
    """Prompts for evaluation, from a stream the training never used."""
    rng = random.Random(seed)
    return [make_example(rng, t) for t in TASKS for _ in range(n_per_task)]


def is_correct(example: Example, generated_text: str) -> bool:
    """True when the greedy continuation starts with the expected answer."""
    want = example.answer.split()
    got = generated_text.split()
    return got[: len(want)] == want
