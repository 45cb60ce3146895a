"""A real async engine (``AsyncLLM``, the engine behind vLLM's OpenAI server and Serve's replicas), asked which
thread its stat loggers record on: ``python -m testkit.async_engine_probe MODEL`` prints one JSON line.

A probe logger (vLLM's public custom stat logger interface, beside vLLM's own loggers) notes the thread of each
``record`` and ``log`` call and the prompt and generation tokens the steps report; the output names the class of
the engine's logger manager and the event loop's thread. Run as a child process so that the patches' switches
(``FUZZSERVE_STATS_THREAD``, ``FUZZSERVE_PATCHES_OFF``) apply to a fresh vLLM import.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections import Counter
from typing import Any

PROMPTS = ["The quick brown fox", "A stat logger records", "Every step of the engine", "Four prompts in flight"]
MAX_TOKENS = 8


async def probe(model: str) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.loggers import StatLoggerBase

    seen: dict[str, Any] = {"record_threads": Counter(), "log_threads": Counter(), "prompt": 0, "generation": 0}

    class Probe(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            seen["record_threads"][threading.current_thread().name] += 1
            if iteration_stats is not None:
                seen["prompt"] += iteration_stats.num_prompt_tokens
                seen["generation"] += iteration_stats.num_generation_tokens

        def log(self):
            seen["log_threads"][threading.current_thread().name] += 1

        def log_engine_initialized(self):
            pass

    args = AsyncEngineArgs(model=model, dtype="float32", enforce_eager=True, max_model_len=256, max_num_seqs=4)
    engine = AsyncLLM.from_engine_args(args, stat_loggers=[Probe])
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)

    async def one(i: int) -> tuple[int, int]:
        async for out in engine.generate(PROMPTS[i], params, request_id=f"probe-{i}"):
            final = out
        return len(final.prompt_token_ids or []), len(final.outputs[0].token_ids)

    try:
        sizes = await asyncio.gather(*(one(i) for i in range(len(PROMPTS))))
        await engine.do_log_stats()
        manager = type(engine.logger_manager).__name__
    finally:
        engine.shutdown()  # the patch lets its thread finish what it holds first
    return {
        "loop_thread": threading.current_thread().name,
        "manager_class": manager,
        "record_threads": dict(seen["record_threads"]),
        "log_threads": dict(seen["log_threads"]),
        "steps_prompt_tokens": seen["prompt"],
        "steps_generation_tokens": seen["generation"],
        "requests_prompt_tokens": sum(p for p, _ in sizes),
        "requests_generation_tokens": sum(g for _, g in sizes),
    }


def main(argv: list[str] | None = None) -> None:
    from serve_app.engine.engine_env import use_engine_env

    use_engine_env()
    (model,) = sys.argv[1:] if argv is None else argv
    sys.stdout.write(json.dumps(asyncio.run(probe(model))) + "\n")


if __name__ == "__main__":
    main()
