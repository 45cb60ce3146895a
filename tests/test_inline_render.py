"""The ``inline_render`` patch: a short text prompt renders on the event loop without a hand-off, into exactly what
upstream's render gives; anything else keeps upstream's path.

The claims are tested on vLLM's real renderer for the fixture model (``renderer_from_config``, the renderer vLLM's
OpenAI server uses; no engine), through the patch's wrappers of upstream's methods, against upstream's methods
themselves (the control: they tokenize on the pool and take turns of the loop, which the checks see).
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections.abc import Awaitable
from typing import Any

import pytest

from patches import inline_render
from patches.framework._core import upstream_of
from patches.inline_render import DEFAULT_MAX_CHARS, MAX_CHARS_ENV, inline_size, max_chars

# ---------------------------------------------------------------------------------------------- pure logic


def test_the_limit_defaults_reads_and_refuses_bad_values():
    assert max_chars({}) == DEFAULT_MAX_CHARS
    assert max_chars({MAX_CHARS_ENV: " 0 "}) == 0
    assert max_chars({MAX_CHARS_ENV: "512"}) == 512
    for bad in ("-1", "2k", "1.5"):
        with pytest.raises(ValueError, match=MAX_CHARS_ENV):
            max_chars({MAX_CHARS_ENV: bad})


@pytest.mark.parametrize(
    "prompts, size",
    [
        ([{"prompt": "abcd"}], 4),
        ([{"prompt": "ab"}, {"prompt_token_ids": [1, 2, 3]}], 5),
        ([{"prompt": "abc", "prompt_token_ids": [1, 2]}], 5),  # the text kept beside its ids (detokenized prompts)
        ([{"prompt": "a" * 10, "cache_salt": "s"}], 10),
        ([{"prompt": "a" * 11}], None),  # over the limit
        ([{"prompt": "a" * 6}, {"prompt": "a" * 5}], None),  # over it together
        ([b"\x00\x01"], None),  # serialized prompt embeddings
        ([{"prompt_embeds": object()}], None),
        ([{"prompt": "a", "multi_modal_data": {"image": object()}}], None),
        ([{"encoder_prompt": {"prompt": "a"}, "decoder_prompt": None}], None),
        ([{"prompt": ["a"]}], None),  # not a string: upstream's own error, on upstream's path
    ],
)
def test_only_plain_prompts_within_the_limit_are_inline(prompts, size):
    assert inline_size(prompts, 10) == size


# ---------------------------------------------------------------------------------------------- vLLM's renderer


@pytest.fixture(scope="module")
def renderer(fixture_model):
    """vLLM's renderer for the fixture model, its tokenizer recording the thread of each call."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers.hf import HfRenderer
    from vllm.renderers.registry import renderer_from_config

    config = EngineArgs(model=str(fixture_model), max_model_len=2048).create_engine_config()
    r = renderer_from_config(config)
    tokenizer_cls = type(r.tokenizer)
    threads: list[int] = []

    def __call__(self, *args, **kwargs):
        threads.append(threading.get_ident())
        return tokenizer_cls.__call__(self, *args, **kwargs)

    r.tokenizer.__class__ = type(f"Recording{tokenizer_cls.__name__}", (tokenizer_cls,), {"__call__": __call__})
    r.tokenizer_threads = threads
    # upstream's template render, whether or not the patches are applied in this process (building vLLM's config
    # loads vLLM's plugins): the chat tests compare the render around it, which is all render_chat_async changes
    r._render_with_timeout = types.MethodType(upstream_of(HfRenderer.__dict__["_render_with_timeout"]), r)
    return r


def _run(awaitable: Awaitable[Any]) -> tuple[Any, int, int, list[bool]]:
    """Run on a fresh event loop: the result, the turns the loop took while it ran (a callback that reschedules
    itself counts them), the tasks created meanwhile, and for each tokenizer call whether it ran on the loop's
    thread."""
    tasks = 0

    def count_tasks(loop, coro, **kwargs):
        nonlocal tasks
        tasks += 1
        return asyncio.Task(coro, loop=loop, **kwargs)

    async def main():
        nonlocal tasks
        turns = 0
        loop = asyncio.get_running_loop()
        loop.set_task_factory(count_tasks)
        done = False

        def tick():
            nonlocal turns
            if not done:
                turns += 1
                loop.call_soon(tick)

        loop.call_soon(tick)
        await asyncio.sleep(0)  # the ticker's first turn
        turns = tasks = 0
        try:
            result = await awaitable
            return result, turns, tasks  # read here: asyncio.run's shutdown makes tasks of its own
        finally:
            done = True

    loop_thread = threading.get_ident()
    result, turns, created = asyncio.run(main())
    return result, turns, created, [t == loop_thread for t in _threads.pop()]


_threads: list[list[int]] = []


def _render(renderer, method: str, wrap: bool, *args, **kwargs):
    """Render through upstream's method (``wrap`` False) or the patch's wrapper of it (building vLLM's config
    loads vLLM's plugins, our patches among them, in this process: upstream's is the function beneath them)."""
    from vllm.renderers.base import BaseRenderer
    from vllm.renderers.hf import HfRenderer

    upstream = upstream_of((HfRenderer if method == "_render_with_timeout" else BaseRenderer).__dict__[method])
    fn = getattr(inline_render, f"_wrap_{method.lstrip('_')}")(upstream) if wrap else upstream
    renderer.tokenizer_threads.clear()

    async def go():
        try:
            return await fn(renderer, *args, **kwargs)
        finally:
            _threads.append(list(renderer.tokenizer_threads))

    return _run(go())


def _same(a, b):
    """Engine inputs equal but for their arrival time."""
    strip = [{k: v for k, v in x.items() if k != "arrival_time"} for x in a]
    return strip == [{k: v for k, v in x.items() if k != "arrival_time"} for x in b]


PROMPT = "the quick brown fox jumps over the lazy dog " * 4


@pytest.mark.engine
def test_a_short_completion_renders_on_the_loop_in_no_turn_into_upstreams_result(renderer):
    patched, turns, _, on_loop = _render(renderer, "render_cmpl_async", True, [{"prompt": PROMPT}])
    upstream, up_turns, _, up_on_loop = _render(renderer, "render_cmpl_async", False, [{"prompt": PROMPT}])
    assert _same(patched, upstream) and patched[0]["prompt_token_ids"]
    assert on_loop == [True] and turns == 0
    # the control: upstream tokenizes on its pool, through turns of the loop (what the patch saves)
    assert up_on_loop == [False] and up_turns >= 3


@pytest.mark.engine
def test_several_prompts_token_ids_and_extras_render_as_upstream_renders_them(renderer):
    prompts = [{"prompt": "abc def"}, {"prompt_token_ids": [1, 5, 7, 9]}]
    kwargs = {"prompt_extras": {"cache_salt": "salt-1"}}
    patched, _, _, on_loop = _render(renderer, "render_cmpl_async", True, prompts, **kwargs)
    upstream, *_ = _render(renderer, "render_cmpl_async", False, prompts, **kwargs)
    assert _same(patched, upstream) and all(p["cache_salt"] == "salt-1" for p in patched)
    assert on_loop == [True]


@pytest.mark.engine
def test_a_long_completion_keeps_upstreams_pool(renderer):
    long = [{"prompt": "x " * (DEFAULT_MAX_CHARS // 2 + 1)}]
    patched, turns, _, on_loop = _render(renderer, "render_cmpl_async", True, long)
    upstream, *_ = _render(renderer, "render_cmpl_async", False, long)
    assert _same(patched, upstream)
    assert on_loop == [False] and turns >= 3


@pytest.mark.engine
def test_a_limit_of_zero_is_upstreams_path(renderer, monkeypatch):
    monkeypatch.setenv(MAX_CHARS_ENV, "0")
    _, turns, _, on_loop = _render(renderer, "render_cmpl_async", True, [{"prompt": PROMPT}])
    assert on_loop == [False] and turns >= 3


@pytest.mark.engine
def test_a_prompt_too_long_for_the_model_fails_as_upstream_fails_it(renderer, monkeypatch):
    monkeypatch.setenv(MAX_CHARS_ENV, "4096")
    ids = [{"prompt_token_ids": [5] * 3000}]  # within the inline limit, over max_model_len (2048)
    errors = []
    for wrap in (True, False):
        with pytest.raises(Exception) as info:
            _render(renderer, "render_cmpl_async", wrap, ids)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1] and "2048" in errors[0][1]


@pytest.mark.engine
def test_a_short_chat_is_prepared_without_a_task_per_step_into_upstreams_result(renderer):
    """The fixture's tokenizer renders the template and its token ids in one call (on upstream's pool, under its
    timeout, patched or not): what the patch leaves out is a task per step."""
    from vllm.renderers.params import ChatParams

    conversation = [{"role": "user", "content": PROMPT}]
    (conv, patched), _, tasks, _ = _render(renderer, "render_chat_async", True, [conversation], ChatParams())
    (up_conv, upstream), _, up_tasks, _ = _render(renderer, "render_chat_async", False, [conversation], ChatParams())
    assert conv == up_conv and _same(patched, upstream) and patched[0]["prompt_token_ids"]
    # upstream gathers each of its three steps (render the messages, tokenize, prepare) in a task per conversation
    assert up_tasks - tasks == 3


@pytest.mark.engine
def test_a_chat_rendered_to_text_is_tokenized_on_the_loop_into_upstreams_result(renderer):
    from vllm.renderers.params import ChatParams

    conversation = [{"role": "user", "content": PROMPT}]
    params = ChatParams(chat_template_kwargs={"tokenize": False})
    (conv, patched), _, _, on_loop = _render(renderer, "render_chat_async", True, [conversation], params)
    (up_conv, upstream), _, _, up_on_loop = _render(renderer, "render_chat_async", False, [conversation], params)
    assert conv == up_conv and _same(patched, upstream) and patched[0]["prompt_token_ids"]
    assert on_loop == [True]
    assert up_on_loop == [False], "the control: upstream tokenizes on its pool"


@pytest.mark.engine
def test_a_long_chat_and_several_conversations_keep_upstreams_path(renderer):
    from vllm.renderers.params import ChatParams

    params = ChatParams(chat_template_kwargs={"tokenize": False})
    long = [{"role": "user", "content": "x " * (DEFAULT_MAX_CHARS // 2 + 1)}]
    (conv, patched), _, _, on_loop = _render(renderer, "render_chat_async", True, [long], params)
    (up_conv, upstream), *_ = _render(renderer, "render_chat_async", False, [long], params)
    assert conv == up_conv and _same(patched, upstream)
    assert on_loop == [False]
    two = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    (convs, patched), _, _, on_loop = _render(renderer, "render_chat_async", True, two, params)
    (up_convs, upstream), *_ = _render(renderer, "render_chat_async", False, two, params)
    assert convs == up_convs and _same(patched, upstream)
    assert on_loop == [False, False]


@pytest.mark.engine
def test_the_template_render_times_out_with_upstreams_handling_and_no_task_of_its_own(renderer, monkeypatch):
    monkeypatch.setenv("VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT", "0.2")
    pool = renderer._executor._inner

    def render(delay: float, wrap: bool):
        async def template():
            await asyncio.sleep(delay)
            return [1, 2, 3]

        return _render(renderer, "_render_with_timeout", wrap, template())

    result, _, tasks, _ = render(0.01, True)
    up_result, _, up_tasks, _ = render(0.01, False)
    assert result == up_result == [1, 2, 3]
    assert (tasks, up_tasks) == (0, 1), "upstream's asyncio.wait_for runs the render as a task of its own"
    for wrap in (True, False):
        with pytest.raises(TimeoutError, match=r"Chat template rendering timed out after 0\.2s"):
            render(5.0, wrap)
        assert renderer._executor._inner is not pool, "a render that timed out leaves a fresh pool"
        pool = renderer._executor._inner
