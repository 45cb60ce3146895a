"""The machinery every patch in :mod:`patches` goes through, apart from the patches themselves.

- :mod:`patches.framework._core`: the version gate, the one ``install`` every change goes through (idempotent,
  keeps the upstream original), the package's logger;
- :mod:`patches.framework.registry`: ``Patch`` (what a patch module declares as ``PATCH``), the header template
  every patch module follows, the index ``python -m patches --list`` prints;
- :mod:`patches.framework.catalogue`: which patches there are, in the order they apply;
- :mod:`patches.framework.switches`: ``FUZZSERVE_PATCHES_OFF`` and the other switches, read by the app and tools too;
- :mod:`patches.framework.target`: one upstream symbol a patch changes, and how;
- :mod:`patches.framework.vllm_internals`: the private vLLM symbols the patches rely on without changing them;
- :mod:`patches.framework.upstream_check`: every target checked against an installed vLLM or a source tree.
"""
