"""The prompts and request parameters of the fuzz tests against real engines (offline and through Serve)."""

from __future__ import annotations

from fixture_model.tasks import held_out_examples

MAX_TOKENS = 8
PROMPTS = [ex.prompt for ex in held_out_examples(4)]  # 12 prompts, 3 tasks


def greedy(xargs=None, max_tokens=MAX_TOKENS, **extra):
    """``SamplingParams`` arguments for :meth:`EngineHost.generate`: greedy, ``xargs`` as ``extra_args``."""
    return {"temperature": 0.0, "max_tokens": max_tokens, "extra_args": xargs, **extra}


def ids(outputs):
    return [o["token_ids"] for o in outputs]


def scale(s):
    return {"fuzz_strength": s}


def gauss(s, seed=0):
    return {"fuzz_strength": s, "fuzz_mode": "gaussian", "fuzz_seed": seed}
