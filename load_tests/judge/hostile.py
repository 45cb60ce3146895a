"""The hostile-client scenario's judgement (:mod:`load_tests.plan.hostile`): each hostile request answered as
planned (refused with its status naming its field or header; the positive control's legal ones served), each
hostile connection closed by the server within its bound, and the normal
clients' goodput in hostile windows within the plan's bound of the calm windows'.

The goodput statistic, fixed before the scenario's measured runs: SLO-meeting
normal requests started in all hostile windows per second, against the same
over all calm windows. The windows run in ABBA blocks (calm, hostile,
hostile, calm), so a drift of the host's speed that is linear over a block
falls on both sides alike; each block's own drop is reported beside
(``block_drops``) to show the noise. A first run with medians over windows
(2026-11-27 03:25) met a drift of 2.3x from the first window to the last
(with other work on the host), which medians of four windows do not cancel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..load.client import RequestResult
from ..load.hostile import HostileConnection
from ..plan.hostile import ANSWERED, CONNECTION_KINDS, HOSTILE_SETS, HostilePlan
from ..plan.slo import Slo
from ..results.models import HostileVerdict, HostileWindow

Window = tuple[str, float, float]  # (calm | hostile, start, end), seconds since the run started


def answered_as_expected(r: RequestResult) -> bool:
    """The answer a hostile request must get: its status, naming its field or header; a legal one (the positive
    control's, planned status below 400) is served."""
    want_status, want_param = r.spec.get("expect_status"), r.spec.get("expect_param")
    if want_status is not None and want_status < 400:
        return r.outcome == "ok" and r.status == want_status
    return (
        want_param is not None
        and r.outcome == "rejected"
        and r.status == want_status
        and (r.error_param == want_param or want_param in (r.error or ""))
    )


def _closed(c: HostileConnection) -> str:
    return f"closed after {c.closed_after_s} s" if c.closed_after_s is not None else "still open"


def window_figures(results: Sequence[RequestResult], windows: Sequence[Window], slo: Slo) -> list[HostileWindow]:
    out = []
    for kind, start, end in windows:
        normal = [
            r
            for r in results
            if start <= r.start < end and r.spec.get("tags", {}).get("kind") not in ("hostile", "bad", "probe")
        ]
        met = sum(slo.met(r) for r in normal)
        out.append(
            HostileWindow(
                kind=kind,
                t_start=start,
                t_end=end,
                normal_started=len(normal),
                normal_slo_met=met,
                goodput_requests_per_s=met / (end - start) if end > start else 0.0,
            )
        )
    return out


def judge_hostile(
    plan: HostilePlan,
    results: Sequence[RequestResult],
    connections: Sequence[HostileConnection],
    windows: Sequence[Window],
    slo: Slo,
) -> HostileVerdict:
    problems: list[str] = []
    requests = _judge_requests(plan, results, problems)
    conns = _judge_connections(plan, connections, problems)
    figures = window_figures(results, windows, slo)
    calm_rate, hostile_rate, drop, blocks = _judge_goodput(plan, figures, problems)
    return HostileVerdict(
        requests=requests,
        connections=conns,
        windows=figures,
        calm_goodput_requests_per_s=calm_rate,
        hostile_goodput_requests_per_s=hostile_rate,
        goodput_drop=drop,
        block_drops=blocks,
        goodput_drop_bound=plan.goodput_drop_bound,
        problems=problems,
    )


def _judge_requests(
    plan: HostilePlan, results: Sequence[RequestResult], problems: list[str]
) -> dict[str, dict[str, int]]:
    """Per hostile request kind: how many were sent and answered as expected; a problem (into ``problems``) for
    each kind some were not, and when none was sent at all."""
    hostile = [r for r in results if r.spec.get("tags", {}).get("kind") == "hostile"]
    requests: dict[str, dict[str, int]] = {}
    for kind, *_ in HOSTILE_SETS[plan.requests]:
        mine = [r for r in hostile if r.spec["tags"]["hostile"] == kind]
        good = sum(answered_as_expected(r) for r in mine)
        requests[kind] = {"sent": len(mine), "answered_as_expected": good, "otherwise": len(mine) - good}
        if len(mine) > good:
            odd = Counter(
                f"{r.outcome} {r.status} {r.error_param or ''}".strip() for r in mine if not answered_as_expected(r)
            )
            want = mine[0].spec.get("expect_param")
            problems.append(
                f"hostile {kind}: {len(mine) - good} of {len(mine)} not "
                + (f"refused naming {want}" if want else f"answered {mine[0].spec.get('expect_status')}")
                + f": {dict(odd)}"
            )
    if plan.share and not hostile:
        problems.append("no hostile request was sent")
    return requests


def _judge_connections(
    plan: HostilePlan, connections: Sequence[HostileConnection], problems: list[str]
) -> dict[str, dict[str, object]]:
    """Per hostile connection kind: how many were opened and closed (or answered) by the server within the bound;
    a problem (into ``problems``) for each kind some were not, and for a planned kind never opened."""
    conns: dict[str, dict[str, object]] = {}
    for kind in CONNECTION_KINDS:
        opened = [c for c in connections if c.kind == kind]
        bound = plan.close_bound_s[kind]
        want = ANSWERED.get(kind)
        closed = [
            c
            for c in opened
            if c.closed_after_s is not None
            and c.closed_after_s <= bound
            and (want is None or c.answer.startswith(f"HTTP/1.1 {want}"))
        ]
        conns[kind] = {
            "opened": len(opened),
            "closed_within_bound": len(closed),
            "bound_s": bound,
            "slowest_close_s": max((c.closed_after_s for c in opened if c.closed_after_s is not None), default=None),
        }
        if len(closed) < len(opened):
            late = [c for c in opened if c not in closed]
            what = f"answered {want}" if want else "closed"
            problems.append(
                f"{len(late)} of {len(opened)} {kind} connection(s) not {what} by the server within "
                f"{bound:g} s (first at t = {late[0].t:.0f} s: "
                f"{late[0].error or _closed(late[0])}{', answer ' + repr(late[0].answer[:40]) if want else ''})"
            )
        if plan.connections and not opened:
            problems.append(f"no {kind} connection was opened")
    return conns


def _judge_goodput(
    plan: HostilePlan, figures: list[HostileWindow], problems: list[str]
) -> tuple[float | None, float | None, float | None, list[float]]:
    """Normal goodput over the calm and the hostile windows, its drop overall and per ABBA block; a problem (into
    ``problems``) when it cannot be compared or fell past the plan's bound."""
    calm = sum(w.normal_slo_met for w in figures if w.kind == "calm")
    under = sum(w.normal_slo_met for w in figures if w.kind == "hostile")
    calm_s = sum(w.t_end - w.t_start for w in figures if w.kind == "calm")
    under_s = sum(w.t_end - w.t_start for w in figures if w.kind == "hostile")
    calm_rate = calm / calm_s if calm_s else None
    hostile_rate = under / under_s if under_s else None
    drop = 1 - hostile_rate / calm_rate if calm_rate and hostile_rate is not None else None
    blocks = [
        1 - (b[1].normal_slo_met + b[2].normal_slo_met) / (b[0].normal_slo_met + b[3].normal_slo_met)
        for b in (figures[i : i + 4] for i in range(0, len(figures) - 3, 4))
        if b[0].normal_slo_met + b[3].normal_slo_met
    ]
    if calm_rate is None or hostile_rate is None:
        problems.append(f"goodput not compared: {calm_s:.0f} s of calm and {under_s:.0f} s of hostile windows")
    elif not calm_rate:
        problems.append("no normal request met the SLO in the calm windows: nothing to compare against")
    elif drop is not None and drop > plan.goodput_drop_bound:
        problems.append(
            f"normal goodput fell {drop:.0%} under attack ({hostile_rate:.2f} req/s in hostile windows "
            f"against {calm_rate:.2f} calm; bound {plan.goodput_drop_bound:.0%})"
        )
    return calm_rate, hostile_rate, drop, blocks
