"""Latency targets for goodput (:class:`Slo`), and the rule that judges one request against them."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict


class Timed(Protocol):
    """What :meth:`Slo.met` reads of a request's result (:class:`load_tests.load.client.RequestResult`)."""

    @property
    def outcome(self) -> str: ...

    @property
    def e2e(self) -> float | None: ...

    @property
    def ttft(self) -> float | None: ...

    @property
    def output_tokens(self) -> int: ...

    @property
    def tpot(self) -> float | None: ...


class Slo(BaseModel):
    """Latency targets for goodput: a successful request counts when it meets every target it can be judged on.

    The rule (:meth:`met`), the same for every request of a run:

    * a stream that produced tokens has a TTFT, and a TPOT when it produced
      two or more: each must be within its target (``ttft_s``, ``tpot_s``),
      and its end-to-end time within ``e2e_s`` when that is set;
    * a request with no TTFT (not streamed, or a stream with no token) is
      judged on its end-to-end time: against ``e2e_s`` when set, else
      against ``ttft_s + tpot_s x (tokens - 1)``, the latest a stream meeting
      both targets could have finished (a stream's TTFT and TPOT give exactly
      its end-to-end time); a target that is not set bounds nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_s: float | None = 2.0
    tpot_s: float | None = 0.2
    e2e_s: float | None = None

    def met(self, r: Timed) -> bool:
        if r.outcome != "ok" or r.e2e is None:
            return False
        if r.ttft is not None:
            tpot = r.tpot
            return (
                (self.ttft_s is None or r.ttft <= self.ttft_s)
                and (self.tpot_s is None or tpot is None or tpot <= self.tpot_s)
                and (self.e2e_s is None or r.e2e <= self.e2e_s)
            )
        return r.e2e <= self.e2e_budget(r.output_tokens)

    def e2e_budget(self, tokens: int) -> float:
        """The end-to-end time a request of ``tokens`` output tokens is allowed when it has no TTFT."""
        if self.e2e_s is not None:
            return self.e2e_s
        if self.ttft_s is None or (self.tpot_s is None and tokens > 1):
            return float("inf")
        return self.ttft_s + (self.tpot_s or 0.0) * max(tokens - 1, 0)


LOADED_SLO = Slo(ttft_s=10.0, tpot_s=1.0, e2e_s=None)  # 256 streams on 2 cores
