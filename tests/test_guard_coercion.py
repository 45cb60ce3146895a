"""The guard judges the value vLLM will use, not the JSON token (issue: caps that a type change slips past).

vLLM's request models validate in pydantic's lax mode: ``"n": "64"`` is n = 64 and ``"use_beam_search": "true"``
is beam search. Each case below was let through by the guard that compared JSON tokens; each must now get its
400 naming the field. The guard reads values with its own adapters (it imports no vLLM): the tests check them
against vLLM's own request models, so a vLLM that changes a field's type fails here, not in production.
"""

from __future__ import annotations

from typing import Any

import pytest

from serve_app.ingress.xargs_policy import RequestLimits, RequestRejected, check_limits, prompt_count
from testkit.guard_app import guarded_client as client


@pytest.mark.parametrize(
    "body, param",
    [
        ({"n": "64"}, "n"),
        ({"n": 64.0}, "n"),
        ({"n": "6_4"}, "n"),
        ({"n": " 64 "}, "n"),
        ({"best_of": "100"}, "best_of"),
        ({"use_beam_search": 1}, "use_beam_search"),
        ({"use_beam_search": "true"}, "use_beam_search"),
        ({"use_beam_search": "yes"}, "use_beam_search"),
        ({"use_beam_search": "on"}, "use_beam_search"),
    ],
)
def test_coerced_values_are_judged_as_vllm_reads_them(body, param):
    for route in ("/v1/completions", "/v1/chat/completions"):
        payload: dict[str, Any] = {
            "model": "m",
            **({"prompt": "count 1"} if route == "/v1/completions" else {"messages": []}),
            **body,
        }
        r = client().post(route, json=payload)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (route, body, r.text)


@pytest.mark.parametrize(
    "prompt, count",
    [
        ("count 1 2", 1),
        ([1, 2, 3], 1),
        (["1", 2], 1),
        ([True, 1], 1),
        (["a", "b", "c"], 3),
        ([[1], [2, 3]], 2),
        ([["1"], [2]], 2),
        ([], 1),
        (None, 1),
        ({"not": "a prompt"}, 1),
    ],
)
def test_a_completions_prompt_counts_as_vllm_reads_it(prompt, count):
    assert prompt_count(prompt) == count


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": ["count 1"] * 17}, "prompt"),  # more prompts than max_batch
        ({"prompt": [[5, 6]] * 17}, "prompt"),
        ({"prompt": ["count 1"] * 4, "n": 5}, "prompt"),  # 20 sequences > 16
        ({"prompt": ["count 1"] * 2, "n": "8", "best_of": 8}, None),  # exactly 16: allowed
        ({"prompt": list(range(1000)), "n": 8}, None),  # one prompt of 1000 token ids
    ],
)
def test_sequences_per_request_are_capped_on_every_generate_route(body, param):
    r = client().post("/v1/completions", json={"model": "m", **body})
    if param is None:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "prompt" in r.json()["error"]["message"]
    # the batch route: conversations x n
    batch = client(routes=("/v1/chat/completions/batch",))
    r = batch.post(
        "/v1/chat/completions/batch", json={"model": "m", "n": 3, "messages": [[{"role": "user", "content": "x"}]] * 6}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and "18" in r.json()["error"]["message"]


def test_the_caps_can_be_raised_per_deployment():
    check_limits({"prompt": ["a"] * 32, "n": 2}, RequestLimits(max_batch=32, max_sequences=64))
    with pytest.raises(RequestRejected):
        check_limits({"prompt": ["a"] * 32, "n": 3}, RequestLimits(max_batch=32, max_sequences=64))


def test_the_guards_adapters_read_values_exactly_as_vllms_request_models():
    """For every value here, the guard's reading of n, use_beam_search and the prompt count equals what vLLM's own
    CompletionRequest makes of it (or both refuse it)."""
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from serve_app.ingress import xargs_policy as xp

    for value in ("64", 64.0, "6_4", " 64 ", "+64", True, 3, "1e2", "0x40", 64.5, "x", None):
        try:
            vllm_n = CompletionRequest.model_validate({"model": "m", "prompt": "a", "n": value}).n
        except ValidationError:
            vllm_n = None
        assert xp._as(xp._INT, value) == vllm_n, value
    for value in (1, 0, "true", "True", "yes", "on", "t", "y", "1", "false", "no", "off", 2, "maybe", None):
        try:
            vllm_beam = ChatCompletionRequest.model_validate(
                {"model": "m", "messages": [], "use_beam_search": value}
            ).use_beam_search
        except ValidationError:
            vllm_beam = None
        assert xp._as(xp._BOOL, value) == vllm_beam, value
    for prompt in ("a b", [1, 2], ["1", 2], [True, 1], ["a", "b"], [[1], [2]], [["1"], [2]]):
        parsed = CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt
        assert xp._as(xp._PROMPT, prompt) == parsed, prompt
    # the field types the adapters copy
    assert CompletionRequest.model_fields["n"].annotation is int
    assert CompletionRequest.model_fields["use_beam_search"].annotation is bool
    assert ChatCompletionRequest.model_fields["use_beam_search"].annotation is bool


def test_the_guards_reading_of_grammars_is_vllms():
    """What the guard counts as a client-written grammar covers what vLLM 0.32 compiles: a forced tool choice turns
    the tools' schemas into a JSON grammar (its tool parsers' ``adjust_request``); "auto" may compile them into a
    structural tag (``parser/abstract_parser.py``, with a tool parser), so only "none" leaves them out; text
    and plain text set no client spec; the removed guided_* fields are vLLM's unknown extras."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.serve.engine.protocol import _REMOVED_GUIDED_FIELDS
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    from serve_app.ingress.xargs_policy import REMOVED_GUIDED_FIELDS, grammar_specs

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice in ("none", "auto", "required", {"type": "function", "function": {"name": "f"}}):
        request = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [], "tools": tools, "tool_choice": choice}
        )
        # passed as vLLM's own tool parser passes them (the function takes None; its annotations say otherwise)
        forced = get_json_schema_from_tools(request.tool_choice, request.tools) is not None  # type: ignore[arg-type]
        counted = "tools" in grammar_specs({"tools": tools, "tool_choice": choice})
        assert counted == (choice != "none"), choice
        assert counted or not forced, choice  # never misses what vLLM compiles
    for fmt, spec in (
        ({"type": "text"}, None),
        ({"type": "json_object"}, "json_object"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}, "json"),
    ):
        params = ChatCompletionRequest.model_validate(
            {"model": "m", "messages": [], "response_format": fmt}
        ).extract_structured_outputs()
        set_fields = (
            [] if params is None else [k for k in ("json", "json_object") if getattr(params, k) not in (None, False)]
        )
        assert set_fields == ([] if spec is None else [spec]), fmt
        assert ("response_format" in grammar_specs({"response_format": fmt})) == (spec is not None), fmt
    assert set(REMOVED_GUIDED_FIELDS) == set(_REMOVED_GUIDED_FIELDS)
    ignored = ChatCompletionRequest.model_validate({"model": "m", "messages": [], "guided_regex": "a+"})
    assert ignored.extract_structured_outputs() is None  # vLLM would serve it unconstrained
