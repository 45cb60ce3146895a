"""Refusals at the ingress (Serve's HAProxy answering 503 before any replica saw the request): which the run may
excuse, and how many.

A refusal says HAProxy's router or replica list is changing. With the
client's retry on (the ``openai`` SDK's behaviour, :mod:`load_tests.load.client`),
a refusal the retry answered is excused only when it falls in a window
around a change the run made to the replica set, and only up to a budget
per change: any refusal outside every window, or more than the budget,
fails the run (a regression of the kind docs/load_tests.md, "Refused at the
ingress", describes would otherwise hide behind the retry). With the retry
off (``--no-ingress-retry``, what curl, vLLM's ``bench serve`` or GuideLLM
see) a refusal is the request's outcome, a 5xx, and fails the run as any
error does.

A change's window opens when the run begins it (a kill, a step) and closes
:data:`AFTER_CHANGE_S` after the step converged (HAProxy's old processes
keep a client's kept connection until keep-alive or ``timeout client``, 30 s
each in our clusters, ends it), or :data:`AFTER_KILL_S` after a replica kill
(Serve starts the replacement, ~90 s under load here, and HAProxy reloads
with it). A step that never converged keeps its window open to the end of
the run (its own failure is reported apart).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..load.client import RequestResult
from ..results.events import Event, ReplicaKilled, StepEvent
from ..results.models import IngressRetries

AFTER_CHANGE_S = 60.0
AFTER_KILL_S = 180.0
# Requests per change the retry may have answered: the most a 256-stream redeploy met (26, 2026-11-26), rounded up.
BUDGET_PER_CHANGE = 32


def change_windows(events: Sequence[Event]) -> list[tuple[float, float]]:
    """``(start, end)`` of each change to the replica set, seconds since the run started."""
    windows = []
    for e in events:
        if isinstance(e, ReplicaKilled):
            windows.append((e.t, e.t + AFTER_KILL_S))
        elif isinstance(e, StepEvent):
            end = e.converged_t + AFTER_CHANGE_S if e.converged and e.converged_t is not None else float("inf")
            windows.append((e.t, end))
    return windows


def ingress_retries(results: Sequence[RequestResult], events: Sequence[Event] = ()) -> IngressRetries:
    """The requests refused at the ingress (and sent again when the retry is on), how they ended, and which fall
    in a change's window."""
    refused = [r for r in results if r.ingress_refusals]
    windows = change_windows(events)
    inside = [r for r in refused if any(start <= r.start <= end for start, end in windows)]
    return IngressRetries(
        requests=len(refused),
        refusals=dict(Counter(reason for r in refused for reason in r.ingress_refusals)),
        answered=sum(r.outcome != "server_error" for r in refused),
        in_change_windows=len(inside),
        outside_change_windows=len(refused) - len(inside),
        budget=BUDGET_PER_CHANGE * len(windows),
        windows=[[round(a, 1), None if b == float("inf") else round(b, 1)] for a, b in windows],
    )


def ingress_problems(ir: IngressRetries) -> list[str]:
    """Why the run's refusals fail it (empty: each fell in a change's window, within the budget)."""
    out = []
    if ir.outside_change_windows:
        out.append(
            f"{ir.outside_change_windows} request(s) refused at the ingress ({ir.refusals}) outside any "
            f"replica change's window {ir.windows or '(the run changed no replica)'}; {ir.answered} of "
            f"{ir.requests} answered on a retry"
        )
    if ir.in_change_windows > ir.budget:
        out.append(
            f"{ir.in_change_windows} request(s) refused at the ingress during replica changes, over the "
            f"budget of {ir.budget} ({BUDGET_PER_CHANGE} per change)"
        )
    return out
