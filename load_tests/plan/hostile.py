"""The hostile-client scenario's plan: what a determined client with a valid key sends beside the normal load, and
how the run alternates calm and hostile windows so that the normal clients' goodput under attack is compared with
the same load, on the same deployment, without it.

Hostile requests (each must get its 400 naming the field or header;
docs/security.md, "Guarantees"): caps in a JSON type vLLM coerces (``"n":
"64"``, ``64.0``, ``"use_beam_search": "true"`` or ``1``), a completion's
prompt list over the batch cap or over the sequence cap with ``n``, the
headers with which Ray would lift its own request timeout, and structured
outputs with a pattern whose grammar costs tens of seconds to compile on a
real vocabulary (docs/results_log.md, the grammar_cost entries).

Hostile connections (each must be closed, or answered, by the server within
its bound): at the ingress, an idle socket that sends nothing, one that
trickles its headers one byte every 0.5 s (slow loris), and a stream whose
reader never reads; at each engine replica's own port (the doors beside the
ingress, which any local process reaches without HAProxy): a trickled head
(closed within the edge's 30 s), a head over the listeners' 32 KiB bound
(431 at once) and ``POST /health`` announcing a 1 MiB body it never sends
(413 at once).

The goodput check's positive control (``hostile-heavy``) swaps the refused
requests for legal ones that each ask for the most the shipped guard admits
(2 prompts x n = 8, its sequence cap, ignoring EOS): the guard must let them
through (a 200 each), and the normal clients' goodput must then fall past the
bound, so the run fails naming the drop. It shows the check can see what it
looks for; ``hostile-aa`` (nothing hostile) shows what the host's noise alone
does to it.

Windows alternate calm, hostile, hostile, calm (ABBA, repeated): a drift of
the host's speed over the run falls on both kinds alike. The normal clients'
goodput in each window is the SLO-meeting normal requests started in it per
second; the verdict compares the median over hostile windows with the median
over calm ones.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# A pattern whose grammar takes 45 s to compile on a 32k vocabulary (0.05 s on the fixture's 239 tokens):
# docs/results_log.md, the grammar_cost entries; docs/benchmarks.md "Grammar compile cost".
COSTLY_PATTERN = "([a-z]{0,50}){0,50}"

# (kind, change to a completion body, extra headers, the status, the field or header the answer names: None if served)
HostileRequest = tuple[str, dict[str, Any], dict[str, str], int, str | None]
HOSTILE_REQUESTS: list[HostileRequest] = [
    ("n_as_string", {"n": "64"}, {}, 400, "n"),
    ("n_as_float", {"n": 64.0}, {}, 400, "n"),
    ("beam_search_as_string", {"use_beam_search": "true"}, {}, 400, "use_beam_search"),
    ("beam_search_as_int", {"use_beam_search": 1}, {}, 400, "use_beam_search"),
    ("prompt_list_over_the_batch_cap", {"prompt": ["count 1"] * 17}, {}, 400, "prompt"),
    ("prompt_list_times_n_over_the_sequence_cap", {"prompt": ["count 1"] * 4, "n": 5}, {}, 400, "prompt"),
    ("timeout_header_zero", {}, {"x-request-timeout-seconds": "0"}, 400, "x-request-timeout-seconds"),
    ("timeout_header_underscored", {}, {"X_Request_Timeout_Seconds": "-1"}, 400, "x-request-timeout-seconds"),
    ("disconnect_disabled_header", {}, {"x-request-disconnect-disabled": "?1"}, 400, "x-request-disconnect-disabled"),
    (
        "costly_grammar_response_format",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "costly", "schema": {"type": "string", "pattern": COSTLY_PATTERN}},
            }
        },
        {},
        400,
        "response_format",
    ),
    (
        "costly_grammar_structured_outputs",
        {"structured_outputs": {"regex": COSTLY_PATTERN}},
        {},
        400,
        "structured_outputs",
    ),
]
HOSTILE_KINDS = tuple(k for k, *_ in HOSTILE_REQUESTS)
# The positive control's requests: legal and as costly as the shipped guard admits (limits.max_sequences 16 =
# 2 prompts x n 8), each answered 200 (no field to name).
HEAVY_REQUESTS: list[HostileRequest] = [
    (
        "heavy_legal_batch",
        {"prompt": ["count 1 2", "count 3 4"], "n": 8, "max_tokens": 96, "ignore_eos": True},
        {},
        200,
        None,
    ),
]
HostileSet = Literal["refused", "heavy"]
HOSTILE_SETS: dict[HostileSet, list[HostileRequest]] = {
    "refused": HOSTILE_REQUESTS,
    "heavy": HEAVY_REQUESTS,
}
ConnectionKind = Literal["idle", "trickle", "stalled_reader", "replica_trickle", "replica_oversized", "probe_withheld"]
CONNECTION_KINDS: tuple[ConnectionKind, ...] = (
    "idle",
    "trickle",
    "stalled_reader",
    "replica_trickle",
    "replica_oversized",
    "probe_withheld",
)
# The kinds that attack an engine replica's own port instead of the ingress.
REPLICA_KINDS: tuple[ConnectionKind, ...] = ("replica_trickle", "replica_oversized", "probe_withheld")
# The kinds the server must answer (the status line it must send first), not only close.
ANSWERED: dict[ConnectionKind, int] = {"replica_oversized": 431, "probe_withheld": 413}


def _close_bounds() -> dict[ConnectionKind, float]:
    return {
        "idle": 35.0,
        "trickle": 35.0,
        "stalled_reader": 90.0,
        "replica_trickle": 35.0,
        "replica_oversized": 5.0,
        "probe_withheld": 5.0,
    }


class HostilePlan(BaseModel):
    """How the hostile share is laid over the load (the scenario's profile runs ``windows x window_s``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    windows: int = Field(8, ge=4, multiple_of=4, description="calm and hostile windows, in ABBA order (whole blocks)")
    window_s: float = Field(30.0, gt=0)
    share: float = Field(
        0.2, ge=0, le=1, description="share of the requests started in a hostile window that are hostile requests"
    )
    connections: int = Field(
        4, ge=0, description="hostile connections of each kind opened at the start of every hostile window"
    )
    requests: HostileSet = Field(
        "refused",
        description="which hostile requests: refused (each must get its 400 naming the field or header) or "
        "heavy (legal and as costly as the guard admits, each answered 200: the goodput check's positive control)",
    )
    close_bound_s: dict[ConnectionKind, float] = Field(
        default_factory=lambda: _close_bounds(),
        description="the server must close each kind within this: a request within 30 s (HAProxy's timeout "
        "http-request, serve_app/ingress/haproxy_edge.sh; a replica's own port the same, "
        "serve_app/ingress/listener_bounds.py), and "
        "a stalled reader's answer, once the engine finished it into the socket buffers, no longer than keep-alive / "
        "timeout client (30 s) after it; the answered kinds get their status within this; docs/security.md",
    )
    goodput_drop_bound: float = Field(
        0.10,
        gt=0,
        lt=1,
        description="the normal clients' goodput in hostile windows may fall at most this much "
        "below the calm windows' (median over windows)",
    )

    def hostile_window(self, k: int) -> bool:
        """Window ``k`` (from 0) is hostile: calm, hostile, hostile, calm, then again."""
        return k % 4 in (1, 2)

    @property
    def duration_s(self) -> float:
        return self.windows * self.window_s
