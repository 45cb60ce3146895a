"""Which patches there are: name -> the module that declares it, in the order :func:`patches.register` applies
them. Its own module so that both the entry point (``patches/__init__.py``) and the registry
(:mod:`patches.framework.registry`) read it without either importing the other."""

from __future__ import annotations

PATCH_MODULES: dict[str, str] = {
    "fuzz": "patches.fuzz",
    "fuzz_layer": "patches.fuzz_layer",
    "cpu_offload": "patches.cpu_offload",
    "kv_faults": "patches.kv_faults",
    "accounting": "patches.accounting",
    "cpu_inproc": "patches.cpu_inproc",
    "shm_wait": "patches.shm_wait",
    "stats_thread": "patches.stats_thread",
    "inline_render": "patches.inline_render",
    "early_submit": "patches.early_submit",
}
