"""fuzzserve's patches to vLLM, loaded as a ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in each of its processes (frontend, EngineCore,
workers). It checks the vLLM version, reads the on/off switches
(``FUZZSERVE_PATCHES_OFF``, see :mod:`patches.framework.switches`) and applies each enabled
patch through the ``PATCH`` its module declares (:mod:`patches.framework.registry`:
every upstream symbol it changes, and how). Each module's header documents
what it changes, why, the upstream issue/PR, the versions it was verified on
and when it can be removed. ``python -m patches --list`` prints the index of
every symbol (docs/patches.md).

Each module directly in this package is one patch (the table below); the
rest is apart: ``patches/framework/`` (version gate, install, registry,
switches, the upstream check), ``patches/definitions/`` (the fuzz keys and
their parser, the noise, metric names, the fault config: read by the app
too) and ``patches/matrix/`` (the fuzz patches' proof against an
independent reference, ``python -m patches.matrix``).

| name   | module          | concern                                            |
|--------|-----------------|----------------------------------------------------|
| fuzz   | patches.fuzz    | per-request ``fuzz_strength`` on input embeddings  |
| fuzz_layer | patches.fuzz_layer | the same at any depth: the residual stream leaving decoder layer k |
| cpu_offload | patches.cpu_offload | vLLM's native KV offloading on the CPU platform |
| kv_faults | patches.kv_faults | seeded KV load failures, delays, lying connector (off unless configured) |
| accounting | patches.accounting | prompt-token accounting that never goes negative |
| cpu_inproc | patches.cpu_inproc | on CPU, a one-worker engine runs its model in EngineCore (no worker process) |
| shm_wait | patches.shm_wait | on CPU, EngineCore and worker sleep instead of spinning while waiting for each other |
| stats_thread | patches.stats_thread | opt-in: the async engine's stat loggers record on their own thread |
| inline_render | patches.inline_render | a short text prompt is tokenized on the event loop, not the renderer's pool |
| early_submit | patches.early_submit | a streamed request reaches the engine when its handler returns |
"""

from __future__ import annotations

import os

# name -> module, in the order of application: patches.framework.catalogue's, which the registry reads too (no
# module of this package imports the package itself).
from .framework.catalogue import PATCH_MODULES as PATCH_MODULES

_applied: set[str] = set()


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Safe to call more than once."""
    from .framework._core import check_vllm_version, logger
    from .framework.switches import OFF_ENV, disabled_patches

    off = disabled_patches(PATCH_MODULES)
    if len(off) == len(PATCH_MODULES):
        logger().info("fuzzserve patches: all switched off (%s)", OFF_ENV)
        return
    import vllm

    check_vllm_version(vllm.__version__)
    from .framework.registry import load

    for name, module_name in PATCH_MODULES.items():
        if name in off or name in _applied:
            continue
        load(module_name).apply()
        _applied.add(name)
    logger().debug("fuzzserve patches applied in pid %d: %s (off: %s)", os.getpid(), sorted(_applied), sorted(off))


def applied() -> list[str]:
    """Names of the patches applied in this process."""
    return sorted(_applied)
