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
import logging
import math
import time

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from serve_app.ray_internals import probe_queue_lens
from serve_app.routing.keys import DEFAULT_PREFIX_CHARS, affinity_key, rendezvous, request_text, routing_key

__all__ = [
    "DEFAULT_PREFIX_CHARS",
    "FuzzAffinityRouter",
    "affinity_key",
    "choose",
    "rendezvous",
    "request_text",
    "routing_key",
]

log = logging.getLogger("ray.serve.fuzzserve.routing")

DEFAULT_IMBALANCED_THRESHOLD = 8
# Probing every replica on every request would cost every replica an RPC per
# request; ten probes a second keep the counts fresh at any request rate.
DEFAULT_PROBE_INTERVAL_S = 0.1
# Counts older than this are not routed on: after an idle spell the last
# burst's counts would send a key away from its replica. Under load probes
# land every ~probe_interval_s, so only the first request after idle waits.
DEFAULT_MAX_VIEW_AGE_S = 1.0


def choose(preferred: str, queue_lens: dict[str, int | None], threshold: float) -> str:
    """The preferred replica unless its queue exceeds the shortest by more than ``threshold`` (or is unknown)."""
    known = {rid: n for rid, n in queue_lens.items() if n is not None}
    if not known:
        return preferred
    least = min(known, key=lambda rid: (known[rid], rid))
    mine = known.get(preferred)
    return least if mine is None or mine - known[least] > threshold else preferred


class FuzzAffinityRouter(FIFOMixin, RequestRouter):
    def initialize_state(
        self,
        prefix_chars: int = DEFAULT_PREFIX_CHARS,
        imbalanced_threshold: float | None = DEFAULT_IMBALANCED_THRESHOLD,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        max_view_age_s: float = DEFAULT_MAX_VIEW_AGE_S,
        **kwargs,
    ):
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

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        key = routing_key(pending_request, self._prefix_chars)
        # no prompt (a GET through HAProxy, a body without one): load alone decides, from any start
        preferred = rendezvous(key if key is not None else "", sorted(by_id))
        if len(by_id) > 1 and (key is None or math.isfinite(self._imbalanced_threshold)):
            lens = await self._queue_lens(candidate_replicas)
            preferred = choose(preferred, lens, 0 if key is None else self._imbalanced_threshold)
            if (n := self._lens.get(preferred)) is not None:  # counted until the next probe says otherwise
                self._lens[preferred] = n + 1
        return [[by_id[preferred]]]
