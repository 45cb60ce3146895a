"""The fuzz-aware router's keys and hash, without Ray: which replica a request's (fuzz setting, prompt prefix) prefers.

A replica can reuse KV for a request only from earlier requests with the
same fuzz cache salt and the same leading tokens, so the key is the salt plus
the first ``prefix_chars`` characters of the prompt (or of the chat messages'
text), and rendezvous (highest-random-weight) hashing over the live
replicas' full ids picks the replica. :class:`serve_app.routing.fuzz_router.FuzzAffinityRouter`
routes with these; the load tests' affinity check (``load_tests/operate/affinity.py``)
predicts with the same functions. Kept apart from the router so that a
process that only predicts (a load generator) does not import Ray Serve,
which reconfigures the importing process's logging.
"""

from __future__ import annotations

import hashlib
import logging
import math
from typing import TYPE_CHECKING, Any

from patches.definitions.fuzz_params import parse_or_neutral

if TYPE_CHECKING:
    from ray.serve.request_router import PendingRequest

log = logging.getLogger("ray.serve.fuzzserve.routing")

# About one 128-token KV block of the CPU platform at ~2-4 characters per token.
DEFAULT_PREFIX_CHARS = 512


def affinity_key(text: str, vllm_xargs: Any) -> str:
    """The routing key of a request: its prompt text behind its fuzz cache salt."""
    spec, _error = parse_or_neutral(vllm_xargs if isinstance(vllm_xargs, dict) else None)
    salt = spec.cache_salt()
    return text if salt is None else f"\x00{salt}\x00{text}"


# Deeper than this a body is not a prompt; its text stops there.
MAX_TEXT_DEPTH = 16


class _Prefix:
    """The first ``limit`` characters of a text put together piece by piece (no limit: all of it)."""

    def __init__(self, limit: int | None):
        self.parts: list[str] = []
        self.left = math.inf if limit is None else limit

    @property
    def full(self) -> bool:
        return self.left <= 0

    def add(self, text: str) -> None:
        if self.left < len(text):
            text = text[: int(self.left)]
        self.parts.append(text)
        self.left -= len(text)

    def walk(self, value: Any, depth: int = 0) -> None:
        """Add the text of a prompt or message content: strings, content parts ``{"text": ...}``, lists of either
        (token ids as ``"<id>,"``)."""
        if self.full or value is None or depth > MAX_TEXT_DEPTH:
            return
        if isinstance(value, str):
            self.add(value)
        elif isinstance(value, dict):  # a content part: {"type": "text", "text": ...}
            self.walk(value.get("text", ""), depth + 1)
        elif isinstance(value, (list, tuple)):
            for v in value:
                if isinstance(v, (str, dict, list, tuple)):
                    self.walk(v, depth + 1)
                else:
                    self.add(f"{v},")
                if self.full:  # before asking for the next item: nothing past the limit is read
                    return
        else:
            self.add(str(value))


def request_text(request: Any, limit: int | None = None) -> str | None:
    """The prompt of a completion, or the concatenated text of a chat's messages, cut at ``limit`` characters;
    None if it has neither, or if its messages are not a list.

    Reads no further than ``limit`` needs, whatever the body's size, and never
    raises: on the direct path this runs on every request before the
    replica's guard has seen its API key, on whatever HAProxy forwarded.
    """
    try:
        acc = _Prefix(limit)
        prompt = getattr(request, "prompt", None)
        if prompt is not None:
            acc.walk(prompt)
            return "".join(acc.parts)
        messages = getattr(request, "messages", None)
        if not isinstance(messages, (list, tuple)):
            return None
        for m in messages:
            acc.walk(m.get("content") if isinstance(m, dict) else getattr(m, "content", m))
            if acc.full:
                break
        return "".join(acc.parts)
    except Exception:  # a shape nobody anticipated: route on load, never fail the request here
        log.debug("fuzz_affinity: no routing text from a malformed request", exc_info=True)
        return None


def routing_key(pending_request: PendingRequest | None, prefix_chars: int) -> str | None:
    """The affinity key of the pending request's first argument that has a prompt or messages."""
    for arg in (pending_request.args if pending_request is not None else None) or ():
        text = request_text(arg, prefix_chars)
        if text is not None:
            return affinity_key(text, getattr(arg, "vllm_xargs", None))
    return None


def rendezvous(key: str, replica_ids: list[str]) -> str:
    """The replica id with the highest hash of (key, id): stable per key, only a removed replica's keys move."""

    def weight(rid: str) -> bytes:
        return hashlib.blake2b(f"{rid}\x00{key}".encode(), digest_size=8).digest()

    return max(replica_ids, key=weight)
