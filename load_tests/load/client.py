"""Send one :class:`~load_tests.plan.workload.RequestSpec` over HTTP and measure it.

aiohttp rather than httpx here: the generator must not be the bottleneck,
and aiohttp's client carries thousands of concurrent streams in one process
with less per-chunk overhead (docs/results_log.md, the loadgen_capacity entry).

Every request ends as exactly one :class:`RequestResult` with an ``outcome``
(:data:`load_tests.load.outcomes.Outcome`):

``ok``
    200 and a complete answer (streams: the ``[DONE]`` event).
``cancelled``
    the client dropped the stream on purpose after N chunks.
``rejected``
    4xx, which the spec expected (bad input); ``error_param`` is the field
    the server named.
``unexpected_4xx`` / ``server_error`` / ``stream_error`` / ``transport_error`` / ``timeout``
    failures; ``truncated``: a 200 stream that ended without ``[DONE]`` and
    without an error event, the "silently dropped" case.

A refusal at the ingress is retried, as the ``openai`` client would (it
retries any 503, twice, after 0.5 s and 1 s): Serve's HAProxy answers 503
with ``X-Serve-Reason: router_unreachable`` (no ingress request router
answered) or ``unknown_replica_id`` (the router named a replica HAProxy's
config does not have yet) *before* it picks a backend, so no replica saw the
request and sending it again cannot run it twice. Both happen in the moments
a replica set changes (a router or engine replica replaced, HAProxy reloaded
with the new list: docs/load_tests.md#refused-at-the-ingress). Only these
two reasons are retried: any other 5xx, and a router that answered but
failed (``router_non_200``), is the request's outcome at once. Every
refusal is kept in ``ingress_refusals``; the timings run from the first
attempt, as the retrying client's user waits through them; a request still
refused after the retries ends ``server_error``.

Timing (monotonic clock, seconds), by tokens, never by visible text (vLLM's
``bench serve`` convention): ``ttft`` is the time to the first chunk that
carries a token, even one whose text decodes to ``""`` (a fuzzed greedy
answer often does); ``itl`` the gaps between such chunks; ``e2e`` the whole
request. A chunk carries a token when it has a choice and is not chat's
role announcement (``{"delta": {"role": "assistant", "content": ""}}``, sent
before any token: vLLM's bench counts it, we do not) or a bare finish (an
empty delta and a ``finish_reason``). A non-streamed request has no
``ttft``: its figures are ``e2e`` and the output tokens from ``usage``
(:meth:`load_tests.plan.slo.Slo.met` says how it is judged).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from ..plan.workload import RequestSpec
from .outcomes import Outcome

# The refusals of Serve's HAProxy that come before any replica is chosen and say the replica set is changing
# (its ingress_request_router.lua: the reason goes out in X-Serve-Reason with the 503).
RETRIED_INGRESS_REASONS = frozenset({"router_unreachable", "unknown_replica_id"})
# The openai client's retry schedule for a 503 (max_retries=2, starting at 0.5 s, doubling).
INGRESS_RETRY_DELAYS_S = (0.5, 1.0)


@dataclass
class RequestResult:
    index: int
    outcome: Outcome
    status: int | None = None
    start: float = 0.0  # seconds since the run started
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    error_param: str | None = None
    text: str | None = None  # the answer, kept only for specs tagged keep_text (the soak's greedy probes)
    spec: dict[str, Any] = field(default_factory=dict)
    ingress_refusals: list[str] = field(default_factory=list)  # each refusal at the ingress, by reason, in order

    @property
    def output_tokens(self) -> int:
        """Tokens the answer carried: the server's ``usage``, else the token chunks counted."""
        return self.completion_tokens or self.chunks

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (streams with >= 2 tokens)."""
        n = self.output_tokens
        if self.ttft is None or self.e2e is None or not self.spec.get("stream") or n < 2:
            return None
        return (self.e2e - self.ttft) / (n - 1)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot"] = self.tpot
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestResult:
        """The inverse of :meth:`to_json` (a line of ``requests.jsonl``): the derived ``tpot`` is dropped and
        computed again, a field this version does not know is an error."""
        return cls(**{k: v for k, v in d.items() if k != "tpot"})


def carries_token(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries output tokens, whatever their text decodes to (see the module's doc)."""
    choices = chunk.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return False  # the usage summary at the end of a stream has no choice
    c = choices[0]
    if "text" in c:  # completions: vLLM sends one chunk per engine step with tokens, never an empty one
        return True
    delta = c.get("delta") or {}
    if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
        return True
    # chat: the speaker's announcement before any token, or a bare finish ({} and a finish_reason), carry none;
    # a step whose tokens decode to "" still sends its (empty) content
    return "role" not in delta and "content" in delta


def ingress_refusal(status: int, headers: Any) -> str | None:
    """The reason of a refusal at the ingress that is safe to retry (see the module's doc), else None."""
    reason = headers.get("X-Serve-Reason")
    return reason if status == 503 and reason in RETRIED_INGRESS_REASONS else None


@asynccontextmanager
async def post_past_ingress_refusals(
    session: aiohttp.ClientSession,
    url: str,
    refusals: list[str],
    delays_s: tuple[float, ...] = INGRESS_RETRY_DELAYS_S,
    **kwargs: Any,
) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST ``url`` (``kwargs``: aiohttp's); a refusal at the ingress (:func:`ingress_refusal`) is appended to
    ``refusals``, read away, and the request sent again after each of ``delays_s`` in turn. Yields the first
    response that is not such a refusal, or the last refusal."""
    for retry_after in (*delays_s, None):
        async with session.post(url, **kwargs) as r:
            refusal = ingress_refusal(r.status, r.headers)
            if refusal:
                refusals.append(refusal)
            if refusal is None or retry_after is None:
                yield r
                return
            await r.read()
        await asyncio.sleep(retry_after)


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    spec: RequestSpec,
    t0: float,
    timeout_s: float = 300.0,
    headers: dict[str, str] | None = None,
    ingress_retry_delays_s: tuple[float, ...] = INGRESS_RETRY_DELAYS_S,
) -> RequestResult:
    """Send ``spec``, again after a refusal at the ingress (the module's doc); never raises for anything the
    server or network does."""
    res = RequestResult(index=spec.index, outcome="transport_error", start=time.monotonic() - t0, spec=spec.to_json())
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            async with post_past_ingress_refusals(
                session,
                f"{base_url}{spec.route}",
                res.ingress_refusals,
                ingress_retry_delays_s,
                data=spec.payload(),
                headers={"content-type": "application/json", **(headers or {}), **spec.headers},
            ) as r:
                res.status = r.status
                await _read_answer(r, res, spec, start)
    except TimeoutError:
        res.outcome, res.error = "timeout", f"no complete answer within {timeout_s}s"
    except (aiohttp.ClientError, ConnectionError, json.JSONDecodeError) as e:
        # a 200 stream whose connection broke is a stream cut short: lost, not a mere transport hiccup
        cut = res.status == 200 and spec.stream
        res.outcome, res.error = ("truncated" if cut else "transport_error"), f"{type(e).__name__}: {e}"[:500]
    if res.e2e is None:
        res.e2e = time.monotonic() - start
    return res


async def _read_answer(r: aiohttp.ClientResponse, res: RequestResult, spec: RequestSpec, start: float) -> None:
    if r.status != 200:
        await _read_error(r, res, spec)
    elif spec.stream:
        await _read_stream(r, res, spec, start)
    else:
        body = await r.json(content_type=None)
        res.e2e = time.monotonic() - start  # no TTFT without a stream
        _usage(res, body.get("usage"))
        choices = body.get("choices") or [{}]
        res.finish_reason = choices[0].get("finish_reason")
        if spec.tags.get("keep_text"):
            res.text = choices[0].get("text", (choices[0].get("message") or {}).get("content"))
        res.outcome = "ok" if spec.expect == "ok" else "unexpected_ok"


async def _read_error(r: aiohttp.ClientResponse, res: RequestResult, spec: RequestSpec) -> None:
    text = await r.text()
    try:
        err = json.loads(text).get("error") or {}
    except (json.JSONDecodeError, AttributeError):
        err = {}
    res.error = (err.get("message") if isinstance(err, dict) else None) or text[:500]
    res.error_param = err.get("param") if isinstance(err, dict) and isinstance(err.get("param"), str) else None
    if 400 <= r.status < 500:
        res.outcome = "rejected" if spec.expect == "4xx" else "unexpected_4xx"
    else:
        res.outcome = "server_error"


async def _read_stream(r: aiohttp.ClientResponse, res: RequestResult, spec: RequestSpec, start: float) -> None:
    last = start  # set to each token's time; read only after the first
    done = False
    async for raw in r.content:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            done = True
            break
        chunk = json.loads(data)
        if "error" in chunk:
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            res.outcome, res.error = "stream_error", str(err.get("message"))[:500]
            return
        _usage(res, chunk.get("usage"))
        choices = chunk.get("choices") or []
        if choices and choices[0].get("finish_reason"):
            res.finish_reason = choices[0]["finish_reason"]
        if carries_token(chunk):
            now = time.monotonic()
            if res.ttft is None:
                res.ttft = now - start
            else:
                res.itl.append(now - last)
            last = now
            res.chunks += 1
            if spec.cancel_after_chunks is not None and res.chunks >= spec.cancel_after_chunks:
                res.outcome = "cancelled"
                res.e2e = now - start
                r.close()  # drop the connection mid-stream, as a client that goes away does
                return
    res.e2e = time.monotonic() - start
    if done:
        res.outcome = "ok" if spec.expect == "ok" else "unexpected_ok"
    else:
        res.outcome, res.error = "truncated", "the stream ended without [DONE] and without an error event"


def _usage(res: RequestResult, usage: dict[str, Any] | None) -> None:
    if usage:
        res.completion_tokens = usage.get("completion_tokens")
        res.prompt_tokens = usage.get("prompt_tokens")
