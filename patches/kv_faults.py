"""Patch ``kv_faults``: seeded fault injection into vLLM's KV offloading connector (off by default).

What it changes (only when ``fuzzserve_faults`` is set in the engine's
``kv_connector_extra_config``, see ``fault_config``; with anything else
there, including no mapping at all, every wrapper passes straight through)
    * ``OffloadingConnectorWorker._init_worker``: wraps the offloading worker
      (any platform) in a :class:`FaultInjectingWorker` that makes a chosen
      share of loads fail and delays load completions. A failed load does not
      copy; its destination blocks are reported to the scheduler as invalid.
    * ``OffloadingConnector.get_block_ids_with_load_errors``: reports those
      blocks, so the scheduler applies ``kv_load_failure_policy``
      (``recompute`` re-computes them; ``fail`` fails the request).
    * ``OffloadingConnector.get_num_new_matched_tokens`` (scheduler side): in
      lying mode, reports inconsistent matched-token counts (negative, more
      than the request has, or changing between calls) as a buggy external
      connector would (cf. LMCache issue 2912).
    * ``OffloadingConnector.get_kv_connector_stats`` and
      ``OffloadPromMetrics.__init__``: every fault injected is counted in
      ``vllm:kv_fault_injections_total{kind}`` (``load_failure``,
      ``load_delay``, ``lie_negative``, ``lie_exceeds_prompt``,
      ``lie_changing``), through the connector's own stats channel (worker or
      scheduler -> EngineCore -> the frontend's Prometheus logger, the path
      upstream's ``vllm:kv_offload_*`` metrics take). So a load test can prove
      that the faults it planned fired, per replica, whether or not the
      accounting patch is on.

Why
    The accounting patch must hold "whatever a connector reports"; these are
    the reports and failures it has to survive, reproducibly (seeded).

Upstream
    Modelled on vLLM's failure-injecting example connector
    (``examples/offline_inference/kv_load_failure_recovery/``), but injected
    into the real ``OffloadingConnector`` so the code under test is the
    connector that runs in production.

Verified on
    vLLM 0.32.0.

Remove when
    Never while the load tests need it; it is inert unless configured.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from .definitions.fault_config import FaultConfig, LoadFaults, LyingReports, fault_config_from
from .definitions.metrics import INJECTIONS_METRIC
from .framework._core import logger
from .framework.registry import Patch, Target

log = logger()


class FaultInjectingWorker:
    """Wraps an ``OffloadingWorker``: failing and delayed loads, everything else passed through."""

    def __init__(self, inner: Any, faults: LoadFaults):
        self.inner = inner
        self.faults = faults
        self._held: deque[tuple[float, Any]] = deque()  # (ready_at, TransferResult)
        self._delays: dict[int, float] = {}
        self._load_errors: set[int] = set()
        self.failed_blocks = 0
        self.unreported: dict[str, int] = {}  # injections not yet shipped in the connector's stats

    def submit_store(self, job_id, src_spec, dst_spec) -> bool:
        return self.inner.submit_store(job_id, src_spec, dst_spec)

    def submit_load(self, job_id, src_spec, dst_spec) -> bool:
        from vllm.v1.kv_offload.base import TransferResult

        fail, delay = self.faults.next_load()
        for kind, happened in (("load_failure", fail), ("load_delay", delay > 0)):
            if happened:
                self.unreported[kind] = self.unreported.get(kind, 0) + 1
        if fail:
            blocks = {int(b) for b in dst_spec.block_ids}
            self._load_errors |= blocks
            self.failed_blocks += len(blocks)
            # The job still completes (the connector requires it); its blocks
            # are reported invalid, which is how a real load failure looks.
            self._held.append((time.monotonic() + delay, TransferResult(job_id=job_id, success=True)))
            return True
        if delay:
            self._delays[job_id] = time.monotonic() + delay
        return self.inner.submit_load(job_id, src_spec, dst_spec)

    def get_finished(self):
        now = time.monotonic()
        for result in self.inner.get_finished():
            self._held.append((self._delays.pop(result.job_id, 0.0), result))
        ready: list[Any] = []  # TransferResults
        waiting: deque[tuple[float, Any]] = deque()
        for at, result in self._held:
            if at <= now:
                ready.append(result)
            else:
                waiting.append((at, result))
        self._held = waiting
        return ready

    def wait(self, job_ids) -> None:
        self.inner.wait(job_ids)

    def shutdown(self) -> None:
        self.inner.shutdown()

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors


def _config_of(vllm_config: Any) -> FaultConfig:
    """Faults configured for this engine; inactive for any config that does not set them (see fault_config_from)."""
    kv_transfer = getattr(vllm_config, "kv_transfer_config", None)
    return fault_config_from(getattr(kv_transfer, "kv_connector_extra_config", None))


def _count(connector: Any, kind: str, n: int = 1) -> None:
    pending = connector.__dict__.setdefault("_fuzzserve_injections", {})
    pending[kind] = pending.get(kind, 0) + n


def _wrap_init_worker(original):
    def _init_worker(self, kv_caches):
        original(self, kv_caches)
        config = _config_of(getattr(self, "vllm_config", None))
        if config.load_failure_rate > 0 or config.load_delay_ms > 0:
            PATCH.target(OFFLOADING_WORKER).apply_to(self, config)
            log.warning("kv_faults: injecting load faults (%s)", config.model_dump())

    return _init_worker


def _fault_injecting(worker: Any, config: FaultConfig) -> FaultInjectingWorker:
    return FaultInjectingWorker(worker, LoadFaults(config))


def _wrap_get_block_ids_with_load_errors(original):
    def get_block_ids_with_load_errors(self):
        errors = set(original(self))
        worker = getattr(getattr(self, "connector_worker", None), "worker", None)
        if isinstance(worker, FaultInjectingWorker):
            errors |= worker.take_load_errors()
        return errors

    return get_block_ids_with_load_errors


def _wrap_get_num_new_matched_tokens(original):
    def get_num_new_matched_tokens(self, request, num_computed_tokens, *args, **kwargs):
        num, load_async = original(self, request, num_computed_tokens, *args, **kwargs)
        liar = self.__dict__.get("_fuzzserve_liar")
        if liar is None:
            vllm_config: Any = getattr(self, "_vllm_config", None)
            config = _config_of(vllm_config)
            liar = LyingReports(config, vllm_config.cache_config.block_size) if config.lying_rate > 0 else False
            self._fuzzserve_liar = liar
            if liar:
                log.warning("kv_faults: lying connector on (%s)", config.model_dump())
        if not liar or num is None:
            return num, load_async
        lie = liar.report(request.request_id, request.num_tokens, num)
        if liar.last_lie:
            _count(self, f"lie_{liar.last_lie}")
        return lie, load_async

    return get_num_new_matched_tokens


def _wrap_get_kv_connector_stats(original):
    """Ship the injections of this process (worker: failed and delayed loads; scheduler: lies) with the
    connector's stats, which EngineCore merges and the frontend's ``OffloadPromMetrics`` exports."""

    def get_kv_connector_stats(self):
        stats = original(self)
        pending = dict(self.__dict__.get("_fuzzserve_injections") or {})
        worker = getattr(getattr(self, "connector_worker", None), "worker", None)
        if isinstance(worker, FaultInjectingWorker):
            for kind, n in worker.unreported.items():
                pending[kind] = pending.get(kind, 0) + n
            worker.unreported = {}
        self.__dict__.pop("_fuzzserve_injections", None)
        pending = {k: n for k, n in pending.items() if n}
        if not pending:
            return stats
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats

        own = OffloadingConnectorStats()
        for kind, n in pending.items():
            own.increase_counter(INJECTIONS_METRIC, n, (kind,))
        return own if stats is None else stats.aggregate(own)

    return get_kv_connector_stats


def _wrap_prom_metrics_init(original):
    """Register the injections counter with the connector's Prometheus metrics, when faults are configured."""

    def __init__(self, vllm_config, *args, **kwargs):
        original(self, vllm_config, *args, **kwargs)
        if not _config_of(vllm_config).active:
            return
        from vllm.v1.kv_offload.base import OffloadingCounterMetadata

        meta = OffloadingCounterMetadata(
            documentation="KV faults injected by fuzzserve's kv_faults patch, by kind (load tests only).",
            labelnames=("kind",),
        )
        self._offloading_metric_metadata[INJECTIONS_METRIC] = meta
        self._offloading_metric_defs[INJECTIONS_METRIC] = self._create_metric(INJECTIONS_METRIC, meta)

    return __init__


def worker_stats(worker: Any) -> dict[str, Any]:
    """Offload and fault counters of one worker, for ``collective_rpc``."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return {"connector": None}
    connector = get_kv_transfer_group()
    inner: Any = getattr(getattr(connector, "connector_worker", None), "worker", None)
    out: dict[str, Any] = {"connector": type(connector).__name__}
    if isinstance(inner, FaultInjectingWorker):
        out.update(
            loads=inner.faults.loads,
            failed_loads=inner.faults.failed,
            failed_blocks=inner.failed_blocks,
            unreported=dict(inner.unreported),
        )
        inner = inner.inner
    if hasattr(inner, "stats"):
        out.update(inner.stats())
    return out


_CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector:OffloadingConnector"
_WORKER = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker:OffloadingConnectorWorker"
OFFLOADING_WORKER = f"{_WORKER}.worker"

PATCH = Patch(
    __doc__,
    (
        Target(
            f"{_WORKER}._init_worker",
            "wrap",
            make=_wrap_init_worker,
            params=("kv_caches",),
            attrs=("vllm_config", "worker"),
            why="wraps the offloading worker when load faults are configured",
        ),
        Target(
            OFFLOADING_WORKER,
            "rebind",
            make=_fault_injecting,
            applied_by=f"{_WORKER}._init_worker",
            why="a FaultInjectingWorker around the offloading worker (any platform): failing and delayed loads",
        ),
        Target(
            f"{_CONNECTOR}.get_block_ids_with_load_errors",
            "wrap",
            make=_wrap_get_block_ids_with_load_errors,
            attrs=("connector_worker",),
            why="reports the failed loads' blocks, as a real load failure does",
        ),
        Target(
            f"{_CONNECTOR}.get_num_new_matched_tokens",
            "wrap",
            make=_wrap_get_num_new_matched_tokens,
            params=("request", "num_computed_tokens"),
            attrs=("_vllm_config",),
            why="lying mode: inconsistent matched-token counts, as a buggy external connector reports",
        ),
        Target(
            f"{_CONNECTOR}.get_kv_connector_stats",
            "wrap",
            make=_wrap_get_kv_connector_stats,
            attrs=("connector_worker",),
            why="ships the injected faults with the connector's own stats",
        ),
        Target(
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics:OffloadPromMetrics.__init__",
            "wrap",
            make=_wrap_prom_metrics_init,
            params=("vllm_config",),
            attrs=("_offloading_metric_metadata", "_offloading_metric_defs", "_create_metric"),
            why="registers vllm:kv_fault_injections_total{kind} when faults are configured",
        ),
    ),
)
