"""Every vLLM symbol the patches rely on without changing it, by patch, each with why: kind ``relies_on``.

A patch's ``PATCH`` declares what it changes; this table declares what its
code calls, subclasses or reads of vLLM's private or internal API (a class
it subclasses, a method it calls with the parameters it passes, an
attribute or dataclass field it reads, a module-level name it looks up),
verified on the vLLM of :data:`patches.framework._core.VERIFIED_VLLM`.
:func:`patches.framework.registry.load` joins each patch's entries to its
``relies_on``, so ``python -m patches --list`` shows them (docs/patches.md)
and ``python -m patches --check-against DIR`` names any that moved, as it
does for the wrapped symbols. Public, documented vLLM API (``LLM``,
``SamplingParams`` as a type, ``vllm.platforms.current_platform``'s
``is_cpu``) is listed only where a patch reads more of it than its contract.

A symbol a patch already wraps is not repeated here: the attributes and
parameters it relies on are on its target. One table for every patch, so
that a patch module is edited only where its behaviour changes.
"""

from __future__ import annotations

from .target import Target

_GPU_WORKER = "vllm.v1.kv_offload.cpu.gpu_worker:SingleDirectionOffloadingHandler"
_KV_BASE = "vllm.v1.kv_offload.base"
_CURRENT_PLATFORM = Target(
    "vllm.platforms:current_platform",
    "relies_on",
    why="`when=on_cpu` asks the current platform whether it is the CPU platform (patches.framework.registry.on_cpu)",
)


def _r(symbol: str, why: str, **checked) -> Target:
    return Target(symbol, "relies_on", why=why, **checked)


RELIES_ON: dict[str, tuple[Target, ...]] = {
    "fuzz": (
        _r(
            "vllm.exceptions:VLLMValidationError",
            keywords=("parameter", "value"),
            why="a bad fuzz setting is raised as vLLM's validation error, which the OpenAI server turns into a 400 "
            "naming `parameter`",
        ),
        _r(
            "vllm.sampling_params:SamplingParams",
            attrs=("extra_args",),
            why="the frontend and the worker read the fuzz settings from `extra_args` (`vllm_xargs`)",
        ),
        _r(
            "vllm.distributed.parallel_state:model_parallel_is_initialized",
            why="a process without parallel groups (one process, a unit test) runs the first pipeline stage",
        ),
        _r(
            "vllm.distributed.parallel_state:get_pp_group",
            why="only the first pipeline stage embeds the tokens: elsewhere a failed embedding probe means no "
            "embedding there, on the first stage it refuses the model",
        ),
        _r(
            "vllm.model_executor.layers.vocab_parallel_embedding:ParallelLMHead",
            why="the output head is a VocabParallelEmbedding too: left out of the input-embedding search",
        ),
        _r(
            "vllm.v1.worker.gpu_input_batch:InputBatch",
            attrs=("num_reqs", "req_ids", "num_computed_tokens_cpu"),
            why="each step's rows and token positions, read to fill the per-token fuzz buffers",
        ),
        _r(
            "vllm.v1.worker.gpu_input_batch:CachedRequestState",
            attrs=("sampling_params", "num_prompt_tokens"),
            why="a request's fuzz settings in the worker (`runner.requests[id].sampling_params`), and where its "
            "prompt ends (`fuzz_tokens` scopes and ramps count generated tokens from there)",
        ),
        _r(
            "vllm.v1.utils:CpuGpuBuffer",
            attrs=("cpu", "gpu", "np", "copy_to_gpu"),
            why="the fuzz buffers are the runner's own kind of buffer (`_make_buffer`), filled through `np` and "
            "copied to the device",
        ),
        _r("vllm.config.model:ModelConfig.get_hidden_size", why="the width of the embedding the noise is drawn for"),
        _r(
            "vllm.config.model:ModelConfig",
            attrs=("enable_prompt_embeds",),
            why="fuzz requests are refused on engines that take prompt embeddings",
        ),
        _r(
            "vllm.model_executor.models.transformers.base:Base.forward",
            params=("input_ids", "positions"),
            keywords=("inputs_embeds",),
            why="the Transformers modeling backend hands the step's tokens to the Hugging Face model as one sequence "
            "([1, n]): the perturbed embedding forward maps that shape (python -m patches.matrix proves it)",
        ),
        _r(
            "vllm.model_executor.models.transformers.base:Base.embed_input_ids",
            params=("input_ids",),
            why="the backend's input embedding is the Hugging Face model's get_input_embeddings(), found by the probe",
        ),
        _r(
            "vllm.model_executor.models.transformers.utils:replace_embedding_class",
            why="the backend replaces the Hugging Face nn.Embedding by VocabParallelEmbedding, the class swapped",
        ),
        _r(
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner._dummy_run",
            params=("num_tokens",),
            keywords=("force_attention", "randomize_inputs"),
            why="the start-up self-test runs the model as vLLM's warm-up does (attention metadata built, so the output "
            "is deterministic; random token ids from a fixed seed, since token 0 may embed to zeros)",
        ),
    ),
    "fuzz_layer": (
        _r(
            "vllm.config.model:ModelConfig.get_total_num_hidden_layers",
            why="the model's decoder-layer count: the length of the layer list looked for, and what fuzz_layer is "
            "resolved against",
        ),
        _r(
            "vllm.v1.engine.async_llm:AsyncLLM.collective_rpc",
            params=("method",),
            why="the frontend asks the workers once for what they found of the layers",
        ),
        _r(
            "vllm.v1.engine.llm_engine:LLMEngine.collective_rpc",
            params=("method",),
            why="the same for the offline engine",
        ),
        _r(
            "vllm.v1.serial_utils:run_method",
            params=("obj", "method"),
            why="collective_rpc looks a method given by name up on the worker (its wrapper forwards attributes), "
            "where the report is an attribute set on the worker object",
        ),
        _r(
            "vllm.model_executor.models.utils:PPMissingLayer",
            why="the placeholder of a layer on another pipeline stage: skipped when the layers are hooked",
        ),
        _r(
            "vllm.distributed.parallel_state:get_pp_group",
            attrs=("world_size",),
            why="fuzz_layer is refused under pipeline parallelism (the step fill runs on the first stage)",
        ),
        _r(
            "vllm.distributed.parallel_state:model_parallel_is_initialized",
            why="a process without parallel groups runs no pipeline parallelism",
        ),
        _r(
            "vllm.v1.worker.gpu_model_runner:GPUModelRunner._dummy_run",
            params=("num_tokens",),
            keywords=("force_attention", "randomize_inputs"),
            why="the layers' self-test runs the model as the fuzz patch's does",
        ),
    ),
    "cpu_offload": (
        _r(
            _GPU_WORKER,
            attrs=(
                "src_tensors",
                "dst_tensors",
                "gpu_to_cpu",
                "layer_refs_per_group",
                "src_blocks_per_chunk",
                "dst_blocks_per_chunk",
                "_canonical_copy_plans",
                "_fill_group_ops",
            ),
            why="subclassed by the host-pool handler, which skips its __init__ (it asserts CUDA tensors and builds "
            "streams) and sets these attributes itself, for the inherited methods below to read",
        ),
        _r(
            f"{_GPU_WORKER}._estimate_max_copy_ops",
            params=("group_sizes",),
            why="called for the number of copy descriptors of a transfer",
        ),
        _r(
            f"{_GPU_WORKER}._fill_direct_ops",
            params=("g_idx",),
            keywords=(
                "group_src",
                "group_dst",
                "group_size",
                "src_skip_count",
                "dst_skip_count",
                "all_src",
                "all_dst",
                "all_sizes",
                "op_idx",
            ),
            why="called (as `_fill_group_ops`) to fill which bytes go where, per group: upstream's own computation",
        ),
        _r(
            f"{_KV_BASE}:OffloadingWorker",
            attrs=("submit_store", "submit_load", "get_finished", "wait", "shutdown"),
            why="subclassed by the host-pool worker, which implements exactly these",
        ),
        _r(
            f"{_KV_BASE}:GPULoadStoreSpec",
            attrs=("block_ids", "group_sizes", "block_indices"),
            why="the engine side of a transfer: its blocks, per group",
        ),
        _r(f"{_KV_BASE}:BlockIDsLoadStoreSpec", attrs=("block_ids",), why="both sides of a transfer"),
        _r(
            f"{_KV_BASE}:TransferResult",
            keywords=("job_id", "success", "transfer_size", "transfer_time"),
            why="what a finished copy reports",
        ),
        _r("vllm.utils.math_utils:cdiv", why="chunks per group, as upstream counts them"),
        _r("vllm.platforms:current_platform", why="the wrap serves the host pool on the CPU platform only"),
    ),
    "kv_faults": (
        _r(
            f"{_KV_BASE}:TransferResult",
            keywords=("job_id", "success"),
            why="a failed load is reported as a finished job whose blocks are invalid, as a real failure is",
        ),
        _r(
            "vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics:OffloadingConnectorStats",
            attrs=("increase_counter", "aggregate"),
            why="the injected faults travel to the frontend inside the connector's own stats",
        ),
        _r(
            f"{_KV_BASE}:OffloadingCounterMetadata",
            keywords=("documentation", "labelnames"),
            why="registers the injections counter with the connector's Prometheus metrics",
        ),
        _r(
            "vllm.config.kv_transfer:KVTransferConfig",
            attrs=("kv_connector_extra_config",),
            why="where the faults are configured (`kv_connector_extra_config.fuzzserve_faults`)",
        ),
        _r("vllm.config.cache:CacheConfig", attrs=("block_size",), why="lies are whole blocks"),
        _r(
            "vllm.v1.request:Request",
            attrs=("request_id", "num_tokens"),
            why="a lie is seeded per request and bounded by its length",
        ),
        _r("vllm.distributed.kv_transfer:get_kv_transfer_group", why="the worker's connector, for its stats"),
        _r("vllm.distributed.kv_transfer:has_kv_transfer_group", why="whether the worker has a connector"),
    ),
    "accounting": (
        _r(
            "vllm.v1.metrics.stats:SchedulerStats",
            attrs=("num_kv_fetch_reqs_by_stage",),
            why="EngineCore's violation and correction counts ride to the frontend in this dict (keys prefixed "
            "`fuzzserve.`), taken out before any stat logger reads it: it must stay a str -> int dict that "
            "EngineCore ships with every step's stats",
        ),
        _r(
            "vllm.v1.request:Request",
            attrs=("prefill_stats", "request_id", "num_tokens", "num_prompt_tokens", "num_computed_tokens"),
            why="each request's prefill stats are checked against its length and re-taken",
        ),
        _r(
            "vllm.v1.metrics.stats:PrefillStats",
            attrs=(
                "num_prompt_tokens",
                "num_computed_tokens",
                "num_cached_tokens",
                "num_local_cached_tokens",
                "num_external_cached_tokens",
            ),
            why="the counts the accounting invariant is about",
        ),
    ),
    "cpu_inproc": (
        _r(
            "vllm.utils.ompmultiprocessing:OMPProcessManager.__init__",
            params=("config",),
            why="built from the engine's config, as MultiprocExecutor builds it for a worker",
        ),
        _r(
            "vllm.utils.ompmultiprocessing:OMPProcessManager.configure_omp_envs",
            keywords=("rank", "local_rank"),
            why="the OpenMP environment upstream gives a CPU worker, set for EngineCore's spawn",
        ),
        _r(
            "vllm.v1.executor.uniproc_executor:UniProcExecutor",
            why="the executor that runs the model in EngineCore's process: its subclasses get the environment",
        ),
        _r(
            "vllm.v1.engine.utils:current_platform",
            why="the platform reference CoreEngineProcManager itself consults (upstream's tests swap it)",
        ),
        _r("vllm.envs:VLLM_ENABLE_V1_MULTIPROCESSING", why="EngineCore in a process of its own"),
        _r(
            "vllm.config.parallel:ParallelConfig",
            attrs=("world_size", "data_parallel_size", "distributed_executor_backend"),
            why="one worker, no data parallelism, a local backend: the engines the patch runs in-process",
        ),
        _CURRENT_PLATFORM,
    ),
    "shm_wait": (_CURRENT_PLATFORM,),
    "stats_thread": (
        _r(
            "vllm.v1.metrics.loggers:StatLoggerManager.log",
            why="the periodic log call (AsyncLLM.do_log_stats) the swapped class hands to the thread, after the "
            "records before it",
        ),
        _r(
            "vllm.v1.engine.async_llm:AsyncLLM.do_log_stats",
            why="how the periodic log reaches the manager: through logger_manager.log()",
        ),
    ),
    "inline_render": (
        _r(
            "vllm.renderers.base:BaseRenderer.render_cmpl",
            params=("prompts", "tok_params"),
            keywords=("prompt_extras", "skip_mm_cache"),
            why="a short completions request renders through upstream's synchronous render, the same steps",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer.render_messages_async",
            params=("messages", "params"),
            why="the chat template renders where upstream renders it (the pool, under its render timeout)",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer.tokenize_prompts",
            params=("prompts", "params"),
            why="a short chat prompt is tokenized inline by upstream's synchronous tokenizing",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer.tokenize_prompts_async",
            params=("prompts", "params"),
            why="a long chat prompt is tokenized on upstream's pool",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer.process_for_engine",
            params=("prompt", "arrival_time"),
            keywords=("skip_mm_cache", "tok_params"),
            why="a short chat prompt is prepared for the engine inline",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer.process_for_engine_async",
            params=("prompt", "arrival_time"),
            keywords=("skip_mm_cache", "tok_params"),
            why="a long chat prompt is prepared for the engine as upstream prepares it",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer._apply_prompt_extras",
            params=("prompts", "prompt_extras"),
            why="the request's extras (cache salt, media_io_kwargs) are added to the tokenized prompt as upstream adds "
            "them",
        ),
        _r(
            "vllm.renderers.base:BaseRenderer",
            attrs=("default_chat_tok_params",),
            why="a chat request without its own tokenize parameters gets upstream's defaults",
        ),
        _r(
            "vllm.envs:VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT",
            why="the chat template's render timeout, read as upstream's _render_with_timeout reads it (0: none)",
        ),
    ),
    "early_submit": (
        _r(
            "vllm.v1.engine.async_llm:AsyncLLM.generate",
            params=("prompt", "sampling_params", "request_id"),
            why="a stream's first step is the engine client's generate, whose first step adds the request",
        ),
        _r(
            "vllm.entrypoints.openai.completion.serving:OpenAIServingCompletion.completion_stream_generator",
            params=("request", "engine_inputs", "result_generator"),
            why="a streamed completion is returned as this async generator, not yet started",
        ),
        _r(
            "vllm.entrypoints.openai.chat_completion.serving:OpenAIServingChat.chat_completion_stream_generator",
            params=("request", "result_generator"),
            why="a streamed chat completion is returned as this async generator, not yet started",
        ),
        _r(
            "vllm.entrypoints.serve.utils.sse_keep_alive:with_sse_keep_alive",
            params=("generator", "interval"),
            why="the routes pass the stream on as it is (keep-alive off) or iterate and close it (anext, aclose)",
        ),
    ),
}
