"""One vLLM engine of the fuzz matrix, in a process of its own: ``python -m patches.matrix.engine_run JOB OUT``.

Reads a job (JSON: the checkpoint, eager or compiled, the prompts as token
ids, one fuzz setting per request, optionally a ``setup`` function to call
first, as a user's plugin would: registering an out-of-tree model), starts vLLM's offline ``LLM`` with
prefix caching on, sends every request of the job in one ``generate`` call
(one mixed batch), twice (the second pass reads the first pass's KV from the
prefix cache, salted per fuzz setting), and writes what the engine produced
to OUT: per pass and request the greedy tokens, their log-probs and the
prompt tokens served from the cache, and the fuzz counters of the worker
that ran the model (:func:`patches.fuzz.worker_stats`).

A process per engine: vLLM loads its plugins once per process, the patches'
switch is read when they load, and the caller kills what it started by
process group. The patches apply here as in any vLLM process (the plugin
entry point), unless the job's environment switches them off.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger("patches.matrix.engine_run")


def _chosen_logprobs(completion: Any) -> list[float]:
    """The log-prob of each generated token (a step without log-probs is left out: the judge refuses the count)."""
    steps = completion.logprobs or []
    return [step[t].logprob for t, step in zip(completion.token_ids, steps, strict=True) if step is not None]


def run(job: dict[str, Any]) -> dict[str, Any]:
    import importlib

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from patches.fuzz import worker_stats

    if job.get("setup"):  # "module:function", run before the engine starts (e.g. registering an out-of-tree model)
        module, _, function = job["setup"].partition(":")
        getattr(importlib.import_module(module), function)()

    llm = LLM(
        model=job["model"],
        dtype="float32",
        enforce_eager=job["mode"] == "eager",
        enable_prefix_caching=True,
        max_model_len=job["max_model_len"],
        max_num_seqs=job["max_num_seqs"],
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
    refused = _refusals(llm, [c["xargs"] for c in job["cases"]])
    served = [i for i, c in enumerate(job["cases"]) if json.dumps(c["xargs"], sort_keys=True) not in refused]
    batch = [prompts[job["cases"][i]["prompt"]] for i in served]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=job["max_tokens"],
            ignore_eos=True,
            logprobs=1,
            extra_args=job["cases"][i]["xargs"],
        )
        for i in served
    ]
    passes = []
    for _ in range(job["passes"]):
        outs = llm.generate(batch, params, use_tqdm=False) if batch else []
        by_case: list[dict[str, Any]] = [
            {"refused": refused.get(json.dumps(c["xargs"], sort_keys=True), "")} for c in job["cases"]
        ]  # replaced below for every case served
        for i, o in zip(served, outs, strict=True):
            by_case[i] = {
                "tokens": list(o.outputs[0].token_ids),
                "logprobs": _chosen_logprobs(o.outputs[0]),
                "cached": o.num_cached_tokens or 0,
            }
        passes.append(by_case)
    stats = llm.collective_rpc(worker_stats)
    return {"passes": passes, "worker": stats}


def _refusals(llm: Any, settings: list[dict[str, Any] | None]) -> dict[str, str]:
    """The settings the engine refuses (its validation error's message, by the setting's JSON), each asked once
    with a one-token request: one refused request would fail ``generate`` for the whole batch."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.inputs import TokensPrompt

    refused: dict[str, str] = {}
    for xargs in {json.dumps(x, sort_keys=True): x for x in settings}.values():
        try:
            llm.generate(
                [TokensPrompt(prompt_token_ids=[1])],
                SamplingParams(max_tokens=1, extra_args=xargs),
                use_tqdm=False,
            )
        except VLLMValidationError as e:
            refused[json.dumps(xargs, sort_keys=True)] = str(e)
    return refused


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m patches.matrix.engine_run JOB.json OUT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    job = json.loads(Path(args[0]).read_text())
    result = run(job)
    Path(args[1]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # the CPU platform spawns EngineCore: the guard is required
    sys.exit(main())
