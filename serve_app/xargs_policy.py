"""The guard's request policy: what a client may set, and how a refusal reads.

Pure logic (no Ray, no vLLM engine), used by the HTTP guard
(``serve_app.guard``) before a request is forwarded to a replica, so a bad
request gets its 4xx at the edge with the field named, and nothing a client
sends can drive the KV connector.

``vllm_xargs`` becomes ``SamplingParams.extra_args`` inside vLLM. The same
dict carries engine-internal keys (``kv_transfer_params`` tells the KV
connector what to load or push; ``ec_transfer_params`` the encoder-cache
connector; ``kv_cache_report_mode`` and ``session_id`` steer reporting and
sessions). vLLM's OpenAI request models also take ``kv_transfer_params`` as a
*top-level* field and copy it into the same place. A client must not set any
of them. Policy:

* fuzz keys (``fuzz_strength``, ``fuzz_mode``, ``fuzz_seed``) are validated
  with ``patches.fuzz_params`` (the engine's own rules);
* reserved engine keys, in ``vllm_xargs`` or at the top level, are refused
  (``reserved="refuse"``, the default) or silently dropped
  (``reserved="strip"``, for clients that cannot be changed);
* any other ``vllm_xargs`` key is refused unless listed in
  ``allowed_extra_keys``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from patches.fuzz_params import KEYS as FUZZ_KEYS
from patches.fuzz_params import FuzzParamError, FuzzSpec, parse_fuzz_args

RESERVED_KEYS = ("kv_transfer_params", "ec_transfer_params", "kv_cache_report_mode", "session_id")
# Top-level request fields that vLLM's protocol copies into extra_args.
RESERVED_TOP_LEVEL = ("kv_transfer_params", "ec_transfer_params")


class XargsPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reserved: Literal["refuse", "strip"] = "refuse"
    allowed_extra_keys: tuple[str, ...] = Field(default=(), description="non-fuzz keys clients may pass through")


DEFAULT_POLICY = XargsPolicy()


class RequestRejected(Exception):
    """A client error, carried as an OpenAI-style error body."""

    def __init__(self, message: str, param: str | None = None, status_code: int = 400,
                 error_type: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status_code, self.error_type = message, param, status_code, error_type

    def body(self) -> dict[str, Any]:
        """The OpenAI error format: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.status_code}}


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
            raise RequestRejected(f"vllm_xargs.{key} is reserved for the engine and cannot be set by clients",
                                  f"vllm_xargs.{key}")
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


def check_request_body(body: Any, policy: XargsPolicy = DEFAULT_POLICY) -> tuple[dict[str, Any], FuzzSpec, bool]:
    """Check a completions/chat request body; return (body to forward, fuzz settings, changed).

    ``changed`` is True when something was stripped, so the caller knows to
    re-encode the body. Raises :class:`RequestRejected`.
    """
    if not isinstance(body, dict):
        raise RequestRejected(f"the request body must be a JSON object, got {type(body).__name__}")
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
