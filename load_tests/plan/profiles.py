"""Load profiles: when the generator starts each request (the data; :mod:`load_tests.load.drive` drives it).

``fixed``
    ``concurrency`` requests in flight at all times (closed loop).
``ramp``
    closed loop whose concurrency grows linearly from 1 to ``concurrency``
    over ``ramp_s`` seconds, then holds.
``poisson``
    open loop: requests arrive at ``rate`` per second with exponential gaps,
    whatever the server does (``concurrency`` caps what is in flight, so a
    stalled server cannot make the generator exhaust memory).
``sweep``
    the capacity search (:mod:`load_tests.judge.capacity`, driven by
    :mod:`load_tests.runner.sweep`): closed-loop steps of
    ``step_s`` seconds at 1, 2, 4, ... requests in flight up to
    ``concurrency``, stopping early once the SLO goodput stops rising or a
    step breaks an invariant or the error budget.

A run stops starting requests when ``duration_s`` has passed or
``max_requests`` have started, whichever comes first (at least one must be
set, except for a sweep, whose steps are bounded by ``step_s``), then waits
for every request in flight: nothing started is abandoned.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed", "ramp", "poisson", "sweep"] = "fixed"
    concurrency: int = Field(
        16, ge=1, description="in flight (fixed/ramp: target; poisson: cap; sweep: the last step's)"
    )
    rate: float | None = Field(None, gt=0, description="poisson: requests per second")
    ramp_s: float = Field(30.0, ge=0, description="ramp: seconds to reach full concurrency")
    duration_s: float | None = Field(None, gt=0)
    max_requests: int | None = Field(None, ge=1)
    step_s: float = Field(
        30.0, gt=0, description="sweep: seconds of load per step (duration_s and max_requests do not apply to a sweep)"
    )

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.kind != "sweep" and self.duration_s is None and self.max_requests is None:
            raise ValueError("set duration_s or max_requests (or both): a run must stop by itself")
        if self.kind == "poisson" and self.rate is None:
            raise ValueError("the poisson profile needs rate (requests per second)")
        return self


class SweepPlan(BaseModel):
    """How the capacity search steps and what it calls the knee."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top: int = Field(256, ge=1, description="the last step's requests in flight")
    start: int = Field(1, ge=1, description="the first step's")
    factor: float = Field(2.0, gt=1, description="each step's concurrency over the one before")
    step_s: float = Field(30.0, gt=0, description="seconds of load per step")
    slo_attainment: float = Field(
        0.95,
        gt=0,
        le=1,
        description="share of a step's complete answers that must meet the SLO for the step to meet it",
    )
    error_budget: float = Field(
        0.01, ge=0, le=1, description="unexpected failures allowed, as a share of a step's requests"
    )
    knee_within: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="the knee's goodput is within this of the best; a step "
        "must beat the best by more to count as rising",
    )
    patience: int = Field(2, ge=1, description="steps in a row without a rise that end the sweep")

    @classmethod
    def from_profile(cls, profile: Profile, **kw) -> SweepPlan:
        return cls(top=profile.concurrency, step_s=profile.step_s, **kw)

    def concurrencies(self) -> list[int]:
        """``start``, ``start x factor``, ... (rounded, each larger than the last), ending at ``top``."""
        out: list[int] = []
        c = float(self.start)
        while round(c) < self.top:
            if not out or round(c) > out[-1]:
                out.append(round(c))
            c *= self.factor
        return [*out, self.top]
