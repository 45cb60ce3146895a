"""The guard's request policy: what a client may set, and how a refusal reads.

Pure logic (no Ray, no vLLM engine), used by the HTTP guard
(``serve_app.ingress.guard``) before a request is forwarded to a replica, so a bad
request gets its 4xx at the edge with the field named, and nothing a client
sends can drive the KV connector.

``vllm_xargs`` becomes ``SamplingParams.extra_args`` inside vLLM. The same
dict carries engine-internal keys (``kv_transfer_params`` tells the KV
connector what to load or push; ``ec_transfer_params`` the encoder-cache
connector; ``kv_cache_report_mode`` and ``session_id`` steer reporting and
sessions). vLLM's OpenAI request models also take ``kv_transfer_params`` as a
*top-level* field and copy it into the same place. A client must not set any
of them. Policy:

* fuzz keys (``fuzz_strength``, ``fuzz_mode``, ``fuzz_seed``, ``fuzz_layer``,
  ``fuzz_tokens``, ``fuzz_strength_end``, ``fuzz_ramp_tokens``) are validated
  with ``patches.definitions.fuzz_params`` (the engine's own rules; the model's range of
  ``fuzz_layer`` is the frontend's, which knows the model);
* reserved engine keys, in ``vllm_xargs`` or at the top level, are refused
  (``reserved="refuse"``, the default) or silently dropped
  (``reserved="strip"``, for clients that cannot be changed);
* any other ``vllm_xargs`` key is refused unless listed in
  ``allowed_extra_keys``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from patches.definitions.fuzz_params import KEYS as FUZZ_KEYS
from patches.definitions.fuzz_params import FuzzParamError, FuzzSpec, parse_fuzz_args

RESERVED_KEYS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode", "session_id")
# Top-level request fields that vLLM's protocols copy into extra_args or hand
# the engine as they are (session_id: the session the KV connector pins).
RESERVED_TOP_LEVEL = ("kv_transfer_params", "ec_transfer_params", "session_id")
# Request headers that carry the same: vLLM reads the session from X-Session-ID
# when the body has none (vllm/entrypoints/generate/base/serving.py), and Ray
# reads it in either spelling (- or _); Serve's multiplexed model id makes
# ray.serve.llm look for a LoRA adapter (a 500 where none is configured).
# Compared in lower case with "_" read as "-".
RESERVED_HEADERS = ("x-session-id", "serve-multiplexed-model-id")
# Fields whose value the engine compiles into a grammar (structured outputs):
# the compile is paid per request, and its cost is not bounded by the spec's
# size (a 49-byte JSON schema with a `pattern` compiles in 0.05 s on the
# fixture's 239 tokens and for minutes on a 128k-token vocabulary:
# docs/security.md), hence off by default. `tools` compile too: under a forced
# tool_choice into a JSON grammar (vllm/tool_parsers/utils.py), and under
# "auto" into a structural tag where a tool parser is configured and a tool
# is strict or parallel_tool_calls is false (vllm/parser/abstract_parser.py).
GRAMMAR_FIELDS = ("structured_outputs", "response_format", "text", "output_config")
# Formats that ask for no grammar: plain text. JSON mode (json_object) compiles one
# fixed grammar, but with this model on CPU it ends in a 500 (the engine's grammar
# rejects its own sampled token, plain vLLM too: docs/security.md), so it counts as
# structured output and is off with the rest.
FIXED_FORMATS = ("text",)
# vLLM 0.32 removed these and ignores them (the answer is 200 and unconstrained):
# refused, whatever the limits, so a client learns it.
REMOVED_GUIDED_FIELDS = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
)


class XargsPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reserved: Literal["refuse", "strip"] = "refuse"
    allowed_extra_keys: tuple[str, ...] = Field(default=(), description="non-fuzz keys clients may pass through")


DEFAULT_POLICY = XargsPolicy()


class RequestLimits(BaseModel):
    """Caps on what one request may ask the engine for (``guard.limits`` in the YAML).

    vLLM's own bounds are far above what one client of a shared deployment
    should get: ``n`` up to 16384 sequences, a batch of any number of
    conversations, beam search of any width, a grammar of any size compiled
    per request. ``max_tokens`` needs no cap here: vLLM bounds it by the
    model's context (``max_model_len``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_n: int = Field(8, ge=1, description="most sequences per prompt (n, best_of)")
    max_batch: int = Field(
        16,
        ge=1,
        description="most prompts in one /v1/completions request, or conversations in "
        "one /v1/chat/completions/batch request",
    )
    max_sequences: int = Field(
        16,
        ge=1,
        description="most sequences one request asks for on any generate route: its prompts (or conversations) x n",
    )
    beam_search: bool = Field(False, description="whether use_beam_search is accepted at all")
    max_beam_width: int = Field(4, ge=1, description="most beams (n with use_beam_search)")
    structured_outputs: bool = Field(
        False,
        description="whether requests may carry a spec the engine compiles into "
        "a grammar (structured outputs, tools unless tool_choice is "
        "none, JSON mode); plain text is always accepted",
    )
    max_grammar_bytes: int = Field(
        16384,
        ge=1,
        description="most bytes of structured-output specs "
        f"({', '.join(GRAMMAR_FIELDS)}, tools) per request, when "
        "structured_outputs is on",
    )


DEFAULT_LIMITS = RequestLimits()


class RequestRejected(Exception):
    """A client error, carried as an OpenAI-style error body."""

    def __init__(
        self, message: str, param: str | None = None, status_code: int = 400, error_type: str = "invalid_request_error"
    ):
        super().__init__(message)
        self.message, self.param, self.status_code, self.error_type = message, param, status_code, error_type

    def body(self) -> dict[str, Any]:
        """The OpenAI error format: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.status_code}
        }


def check_xargs(xargs: Any, policy: XargsPolicy = DEFAULT_POLICY) -> tuple[dict[str, Any] | None, FuzzSpec]:
    """Return the ``vllm_xargs`` to forward (None when empty) and the request's fuzz settings.

    Raises :class:`RequestRejected` naming ``vllm_xargs.<key>``.
    """
    if xargs is None:
        return None, parse_fuzz_args(None)
    if not isinstance(xargs, Mapping):
        raise RequestRejected(f"vllm_xargs must be an object, got {type(xargs).__name__}", "vllm_xargs")
    forwarded: dict[str, Any] = {}
    for key, value in xargs.items():
        if key in RESERVED_KEYS:
            if policy.reserved == "strip":
                continue
            raise RequestRejected(
                f"vllm_xargs.{key} is reserved for the engine and cannot be set by clients", f"vllm_xargs.{key}"
            )
        if key in FUZZ_KEYS or key in policy.allowed_extra_keys or (isinstance(key, str) and key.startswith("fuzz_")):
            forwarded[key] = value
            continue
        allowed = ", ".join((*FUZZ_KEYS, *policy.allowed_extra_keys))
        raise RequestRejected(f"vllm_xargs.{key} is not accepted; allowed keys: {allowed}", f"vllm_xargs.{key}")
    try:
        spec = parse_fuzz_args(forwarded)
    except FuzzParamError as e:
        raise RequestRejected(str(e), f"vllm_xargs.{e.field}") from None
    return (forwarded or None), spec


# The values vLLM will use, read the way vLLM reads them. vLLM's request models validate in pydantic's lax mode,
# so "64", 64.0 and "6_4" are n = 64 and "true", "yes", 1 are use_beam_search = True: a check of the JSON token
# alone lets them through. These adapters are built from the same types as vLLM 0.32's fields (CompletionRequest
# and ChatCompletionRequest: n int, use_beam_search bool, prompt the union below; tests/test_guard_coercion.py keeps
# them equal to vLLM's own), and a value they cannot read is left to vLLM's own 400.
_INT = TypeAdapter(int)
_BOOL = TypeAdapter(bool)
_PROMPT = TypeAdapter(
    list[Annotated[int, Field(ge=0)]] | list[list[Annotated[int, Field(ge=0)]]] | str | list[str] | None
)


def _as(adapter: TypeAdapter, value: Any) -> Any:
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return None


def prompt_count(prompt: Any) -> int:
    """How many prompts a completion's ``prompt`` is, as vLLM reads it: a string or one list of token ids is one;
    a list of strings, or of token-id lists, is one per item."""
    value = _as(_PROMPT, prompt)
    if value is None or isinstance(value, str):
        return 1
    if value and all(isinstance(v, int) for v in value):
        return 1
    return max(1, len(value))


def _fixed_format(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type") in FIXED_FORMATS


def _tools_off(choice: Any) -> bool:
    """``tool_choice: "none"`` (OpenAI) or ``{"type": "none", ...}`` (Anthropic, Responses): no tool is compiled."""
    return choice == "none" or (isinstance(choice, Mapping) and choice.get("type") == "none")


def grammar_specs(body: dict[str, Any]) -> dict[str, Any]:
    """The client-written specs in ``body`` that vLLM may compile into a grammar, by the field that carries them.

    Plain text asks for no grammar (``response_format``; the Responses API's ``text.format`` and the
    Messages API's ``output_config.format``, where a value that is not an object is vLLM's to refuse or ignore).
    ``tools`` count unless ``tool_choice`` is "none": vLLM compiles them under a forced choice, and under "auto"
    where a tool parser is configured (this module's notes).
    """
    found = {k: body[k] for k in ("structured_outputs", "response_format") if body.get(k) is not None}
    if _fixed_format(found.get("response_format")):
        del found["response_format"]
    for key in ("text", "output_config"):
        value = body.get(key)
        if isinstance(value, Mapping) and value.get("format") is not None and not _fixed_format(value["format"]):
            found[key] = value
    if body.get("tools") and not _tools_off(body.get("tool_choice")):
        found["tools"] = {"tools": body["tools"], "tool_choice": body.get("tool_choice")}
    return found


def grammar_bytes(grammar: dict[str, Any]) -> int:
    """The size the byte cap judges: the specs of :func:`grammar_specs`, as compact JSON."""
    return len(json.dumps(grammar, separators=(",", ":")))


def check_limits(body: dict[str, Any], limits: RequestLimits = DEFAULT_LIMITS, batch: bool = False) -> None:
    """Refuse a body that asks for more than ``limits`` allow, judging the values vLLM will use, naming the field
    (vLLM refuses what it cannot read itself)."""
    beam = "use_beam_search" in body and _as(_BOOL, body["use_beam_search"]) is True
    if beam and not limits.beam_search:
        raise RequestRejected("use_beam_search is not accepted by this deployment", "use_beam_search")
    most = limits.max_beam_width if beam else limits.max_n
    per_prompt = 1
    for key in ("n", "best_of"):
        n = _as(_INT, body[key]) if body.get(key) is not None else None
        if n is None:
            continue
        if n > most:
            what = "beam width" if beam else "sequences per prompt"
            raise RequestRejected(f"{key} must be <= {most} ({what} this deployment allows), got {n}", key)
        per_prompt = max(per_prompt, n)
    if batch and isinstance(body.get("messages"), list):
        prompts, field = len(body["messages"]), "messages"
        unit = "conversations in one batch request"
    elif "prompt" in body:
        prompts, field, unit = prompt_count(body["prompt"]), "prompt", "prompts in one request"
    else:
        prompts, field, unit = 1, None, ""
    if prompts > limits.max_batch:
        raise RequestRejected(f"{field} must hold <= {limits.max_batch} {unit}, got {prompts}", field)
    if prompts * per_prompt > limits.max_sequences:
        param = field if prompts > 1 else "n"
        raise RequestRejected(
            f"{param}: this request asks for {prompts} x {per_prompt} = {prompts * per_prompt} "
            f"sequences (prompts x n); this deployment allows <= {limits.max_sequences} per request",
            param,
        )
    for key in REMOVED_GUIDED_FIELDS:
        if key in body:
            raise RequestRejected(
                f"{key} was removed from vLLM, which ignores it (the output would not be "
                "constrained); use response_format or structured_outputs",
                key,
            )
    grammar = grammar_specs(body)
    if grammar and not limits.structured_outputs:
        field = next(iter(grammar))
        raise RequestRejected(
            f"{field}: structured outputs are off on this deployment (guard.limits."
            "structured_outputs); a grammar's compile cost is not bounded by its size "
            "(docs/security.md)",
            field,
        )
    if grammar:
        size = grammar_bytes(grammar)
        if size > limits.max_grammar_bytes:
            raise RequestRejected(
                f"structured-output specs ({', '.join(grammar)}) must be <= "
                f"{limits.max_grammar_bytes} bytes, got {size}",
                next(iter(grammar)),
            )


def check_request_body(
    body: Any, policy: XargsPolicy = DEFAULT_POLICY, limits: RequestLimits = DEFAULT_LIMITS, batch: bool = False
) -> tuple[dict[str, Any], FuzzSpec, bool]:
    """Check the body of a route that builds sampling parameters; return (body to forward, fuzz settings, changed).

    ``changed`` is True when something was stripped, so the caller knows to
    re-encode the body. ``batch``: the body of ``/v1/chat/completions/batch``
    (``messages`` is a list of conversations). Raises :class:`RequestRejected`.
    """
    if not isinstance(body, dict):
        raise RequestRejected(f"the request body must be a JSON object, got {type(body).__name__}")
    check_limits(body, limits, batch)
    changed = False
    for key in RESERVED_TOP_LEVEL:
        if body.get(key) is None:
            continue
        if policy.reserved == "refuse":
            raise RequestRejected(f"{key} is reserved for the engine and cannot be set by clients", key)
        body = {k: v for k, v in body.items() if k != key}
        changed = True
    if "vllm_xargs" in body:
        forwarded, spec = check_xargs(body["vllm_xargs"], policy)
        if forwarded != body["vllm_xargs"]:
            body = {**body, "vllm_xargs": forwarded}
            changed = True
    else:
        spec = parse_fuzz_args(None)
    return body, spec, changed
