"""How one request ended: :data:`Outcome`, the one definition of the outcomes the load tests know.

Every request ends as exactly one outcome (``load_tests.load.client`` says when each
happens); a run's summary counts them, plus ``lost`` for a request the generator
started and has no result for.
"""

from __future__ import annotations

from typing import Literal, get_args

Outcome = Literal[
    "ok",
    "cancelled",
    "rejected",
    "unexpected_4xx",
    "unexpected_ok",
    "server_error",
    "stream_error",
    "transport_error",
    "truncated",
    "timeout",
]
# What a summary counts: every outcome, and "lost" (started, never finished: no result at all).
Counted = Literal[Outcome, "lost"]

OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
# A complete answer, a stream the client dropped on purpose, a bad request refused as it should be.
OK_OUTCOMES: tuple[Outcome, ...] = ("ok", "cancelled", "rejected")
FAILURE_OUTCOMES: tuple[Outcome, ...] = tuple(o for o in OUTCOMES if o not in OK_OUTCOMES)
# Failures in which an answer went missing (the request was lost, not refused).
LOST_OUTCOMES: tuple[Counted, ...] = ("truncated", "timeout", "lost")
