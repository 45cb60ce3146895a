"""A stopped benchmark tears down what it started: SIGTERM unwinds like Ctrl-C.

Why: the benchmarks start Ray clusters and vLLM servers and stop them in
``finally`` blocks (:class:`load_tests.operate.local_cluster.LocalCluster`'s
``close``, the arms' ``stop``). A SIGTERM (``kill PID``, a job runner's stop,
a timeout) ends a Python process at once by default, skipping them: a
``vs_vllm`` run stopped that way during a phase left its whole Ray cluster
running (GCS, raylet, Serve, HAProxy, the replica and its EngineCore), while
SIGINT unwound through the same ``finally`` blocks and left nothing
(benchmarks/README.md says how to stop a run). So TERM raises
``KeyboardInterrupt`` in the main thread, as SIGINT does.
"""

from __future__ import annotations

import signal


def stop_on_term() -> None:
    """From now on a SIGTERM to this process raises ``KeyboardInterrupt`` in its main thread (call it there)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
