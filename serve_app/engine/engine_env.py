"""The environment every vLLM engine of this project runs with, in one table: in Serve's replicas, in the tests'
and benchmarks' engines, in plain vLLM servers started for comparison, and in every command of ``scripts/env.sh``.

=============================  =====  ==========================================================
variable                       value  why
=============================  =====  ==========================================================
``HF_HUB_OFFLINE``             1      no model hub is reachable from these machines: never try
                                      one (a lookup would hang until it times out, then fail)
``VLLM_CPU_KVCACHE_SPACE``     1      GiB of KV cache per CPU engine; unset, vLLM's CPU worker
                                      sizes it from free RAM (~92 %), and two engines on one
                                      host would not fit
``VLLM_USE_AOT_COMPILE``       0      vLLM 0.32's AOT compile cache never loads on CPU (its
                                      load calls ``finalize_loading`` on what torch's stock
                                      Inductor backend saved: a plain function; upstream, not
                                      the patches): each start paid a failed load, a recompile
                                      and a re-save. Off, Inductor's own cache serves restarts:
                                      warm engine init 8 s instead of 20 (docs/cpu_inproc.md)
=============================  =====  ==========================================================

``serve_config.yaml`` repeats the table in its application's ``runtime_env``
(YAML cannot import it; ``tests/test_serve_config.py`` keeps them equal).
Entry points call :func:`use_engine_env` first thing in ``main`` (never at
import time): the process and whatever it starts get the table, where their
environment does not decide otherwise.
"""

from __future__ import annotations

import os

HF_HUB_OFFLINE = "HF_HUB_OFFLINE"
KV_CACHE_SPACE = "VLLM_CPU_KVCACHE_SPACE"
AOT_COMPILE = "VLLM_USE_AOT_COMPILE"
ENGINE_ENV: dict[str, str] = {HF_HUB_OFFLINE: "1", KV_CACHE_SPACE: "1", AOT_COMPILE: "0"}


def with_engine_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with every :data:`ENGINE_ENV` variable it does not set itself."""
    return {**ENGINE_ENV, **env}


def use_engine_env() -> None:
    """This process, and what it starts, runs with :data:`ENGINE_ENV` where its environment does not decide."""
    for key, value in ENGINE_ENV.items():
        os.environ.setdefault(key, value)
