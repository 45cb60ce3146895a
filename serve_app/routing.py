"""Fuzz-aware affinity routing: a request goes to the replica that holds the KV it can reuse.

A replica can reuse KV for a request only from earlier requests that had the
same fuzz cache salt (the engine salts the cache per fuzz setting,
``patches.fuzz``) and the same leading tokens (prefix caching and offloading
work in whole KV blocks). :class:`FuzzAffinityRouter` routes on exactly that:
its key is the salt plus the first ``prefix_chars`` characters of the prompt
(or of the chat messages' text), and the key picks a replica by rendezvous
(highest-random-weight) hashing over the live replicas. So

* requests with the same salt and prefix land on the same replica while it
  lives; requests with the same prompt but another fuzz setting, which
  could not share its KV, spread like unrelated prompts;
* no shared state: any number of routers (or a restarted one) agree on every
  key, and when a replica goes, only its keys move;
* load: when the preferred replica has more than ``imbalanced_threshold``
  requests in flight beyond the least-loaded one, the least-loaded replica
  takes the request instead. The in-flight counts are the replicas' own
  (one RPC to each, at most every ``probe_interval_s``, refreshed in the
  background, one probe at a time; between probes the router adds what it
  routed itself, so a burst spreads). A request waits for a probe only when
  the router has no view younger than ``max_view_age_s`` (its first request,
  a new replica, the first request after an idle spell): under load the
  background probes keep the view fresh and nobody waits.
  ``imbalanced_threshold: null`` routes on affinity alone, without probing.

Why not Ray's ``PrefixCacheAffinityRouter``: on the direct-streaming path
(what ``serve_config.yaml`` ships) Ray's ingress request router picks with
``choose_replica(..., _reserve=False)``, which takes the first replica a
policy ranks and never calls ``on_request_routed``, the hook where that
router records which replica saw which prefix. Its tree stays empty, every
prompt falls to "smallest tenant" with all tenants at 0, and every request
goes to the same replica (measured: 30 of 30 requests on one of two
replicas). It also makes three blocking calls to a detached tree actor per
request. ``routing: prefix_affinity`` still selects it (router path).

Selected with ``routing: fuzz_affinity`` in the app's arguments (what
``serve_config.yaml`` ships); the other choices are Ray's: ``power_of_two``
(Serve's default; on the direct path a random one of two, as Ray's ingress
router does not probe), ``round_robin`` (Ray's direct-streaming default) and
``prefix_affinity``. On the direct path the policy sees the request body as
a namespace of its fields (``LLMRouter``, with
``RAY_SERVE_INGRESS_REQUEST_ROUTER_FORWARD_BODY=1``), on the router path the
parsed request: both expose ``prompt`` / ``messages`` and ``vllm_xargs``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from patches.fuzz_params import parse_or_neutral

from .ray_internals import probe_queue_lens

log = logging.getLogger("ray.serve.fuzzserve.routing")

# About one 128-token KV block of the CPU platform at ~2-4 characters per token.
DEFAULT_PREFIX_CHARS = 512
DEFAULT_IMBALANCED_THRESHOLD = 8
# Probing every replica on every request would cost every replica an RPC per
# request; ten probes a second keep the counts fresh at any request rate.
DEFAULT_PROBE_INTERVAL_S = 0.1
# Counts older than this are not routed on: after an idle spell the last
# burst's counts would send a key away from its replica. Under load probes
# land every ~probe_interval_s, so only the first request after idle waits.
DEFAULT_MAX_VIEW_AGE_S = 1.0


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
            text = text[:int(self.left)]
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


def choose(preferred: str, queue_lens: dict[str, int | None], threshold: float) -> str:
    """The preferred replica unless its queue exceeds the shortest by more than ``threshold`` (or is unknown)."""
    known = {rid: n for rid, n in queue_lens.items() if n is not None}
    if not known:
        return preferred
    least = min(known, key=lambda rid: (known[rid], rid))
    mine = known.get(preferred)
    return least if mine is None or mine - known[least] > threshold else preferred


class FuzzAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, prefix_chars: int = DEFAULT_PREFIX_CHARS,
                         imbalanced_threshold: float | None = DEFAULT_IMBALANCED_THRESHOLD,
                         probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                         max_view_age_s: float = DEFAULT_MAX_VIEW_AGE_S, **kwargs):
        if prefix_chars < 1:
            raise ValueError(f"prefix_chars must be >= 1, got {prefix_chars}")
        if probe_interval_s < 0:
            raise ValueError(f"probe_interval_s must be >= 0, got {probe_interval_s}")
        if not max_view_age_s >= probe_interval_s:
            raise ValueError(f"max_view_age_s must be >= probe_interval_s ({probe_interval_s}), got {max_view_age_s}")
        self._prefix_chars = prefix_chars
        self._imbalanced_threshold = math.inf if imbalanced_threshold is None else float(imbalanced_threshold)
        self._probe_interval_s = probe_interval_s
        self._max_view_age_s = max_view_age_s
        self._lens: dict[str, int | None] = {}
        self._lens_at = -math.inf  # when the last refresh started
        self._view_at = -math.inf  # when the last refresh's answers arrived
        self._probe: asyncio.Future | None = None  # the one refresh in flight

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[str, int | None]:
        """In-flight requests per replica, as last probed plus what this router routed since.

        A view older than ``probe_interval_s`` starts one refresh in the
        background (one at a time) and the request is routed on what is
        known. A request waits for the refresh only when there is no usable
        view: a replica never probed, or answers older than
        ``max_view_age_s``. Waiting for probes on every request put each
        concurrent request behind its own probe of busy replicas: at 256
        streams on 2 cores the route call's median grew to 0.7 s, its tail
        past HAProxy's 5 s router timeout (503 ``router_unreachable``).
        """
        ids = [r.replica_id.to_full_id_str() for r in replicas]
        now = time.monotonic()
        usable = all(i in self._lens for i in ids) and now - self._view_at <= self._max_view_age_s
        if not usable or now - self._lens_at >= self._probe_interval_s:
            if self._probe is None or self._probe.done():
                self._lens_at = now
                self._probe = asyncio.ensure_future(self._refresh(replicas))
            if not usable:
                await asyncio.shield(self._probe)
        return {i: self._lens.get(i) for i in ids}

    async def _refresh(self, replicas: list[RunningReplica]) -> None:
        """Replace the view with the replicas' answers (None: no answer in time; a failed probe answers None)."""
        ids = [r.replica_id.to_full_id_str() for r in replicas]
        try:
            answers = {r.replica_id.to_full_id_str(): n for r, n in await probe_queue_lens(self, replicas)}
        except Exception:  # routing must go on: route on affinity until a probe answers
            log.warning("fuzz_affinity: probing the replicas' queue lengths failed", exc_info=True)
            answers = {}
        self._lens = {i: answers.get(i) for i in ids}
        self._view_at = time.monotonic()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        key = routing_key(pending_request, self._prefix_chars)
        # no prompt (a GET through HAProxy, a body without one): load alone decides, from any start
        preferred = rendezvous(key if key is not None else "", sorted(by_id))
        if len(by_id) > 1 and (key is None or math.isfinite(self._imbalanced_threshold)):
            lens = await self._queue_lens(candidate_replicas)
            preferred = choose(preferred, lens, 0 if key is None else self._imbalanced_threshold)
            if self._lens.get(preferred) is not None:  # counted until the next probe says otherwise
                self._lens[preferred] += 1
        return [[by_id[preferred]]]
