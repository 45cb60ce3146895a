"""The verdict on one request of the matrix: did the engine fuzz it as the reference says it must? Pure logic.

Two comparisons, both against :class:`patches.matrix.reference.Reference`:

* **tokens**: the engine's greedy tokens against the reference's own greedy
  continuation of the same prompt under the same fuzz setting;
* **log-probs, teacher-forced**: the reference run on the *engine's* tokens;
  at each generated position, the engine's log-prob of its token against
  the reference's log-prob of that token (``dlogprob``), and how far that
  token is from the reference's best one (``gap``, 0 when they pick the
  same).

``equal``: the same tokens and every ``dlogprob`` within :data:`ATOL`.
``refused``: the engine refused the setting (HTTP 400 / a validation error:
a ``fuzz_layer`` on a model whose layers it cannot reach), the message
kept; the matrix expects every architecture to serve every setting, so a
refusal fails its row.
``near-tie``: other tokens, but at every position the engine's token is
within :data:`TIE` of the reference's best and the log-probs agree within
:data:`ATOL`: two float32 implementations breaking a tie differently, shown
as such, never counted as equal. ``differs``: anything else, the verdict a
request served unfuzzed gets. A request whose second pass (its prompt's KV
from the prefix cache) gives other tokens than the first ``differs`` too.

The bounds are fixed here, before any run: float32 vLLM CPU kernels against
transformers' eager float32 attention on 2-layer models differ by about
1e-5 nats (docs/fuzz.md shows each architecture's figure at s = 0); a
request left unfuzzed moves its log-probs by 1e-2 and more.

``float-noise`` (added after the first 4-layer run, where Granite's 3 of 152
requests had the reference's tokens but log-probs 1.0-2.3e-3 nats off, and
the reference itself, float32 against float64, moved as much on the same
requests): a request with the reference's tokens, repeated, whose log-probs
are beyond :data:`ATOL` of the float32 reference but within ``ATOL + floor``
of the reference run in float64, ``floor`` being how far the float32
reference is from the float64 one on that request. The engine is then as
close to the exact answer as a float32 implementation of the reference is;
shown apart (like a near-tie), never counted as equal. :func:`rejudge` makes
that call; the matrix runs the float64 reference only for such requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ATOL = 1e-3  # nats: the engine's log-prob of its token against the reference's
TIE = 1e-3  # nats: how close to the reference's best a differing token must be to be a near-tie


@dataclass(frozen=True)
class CaseVerdict:
    """One request of the matrix, judged."""

    label: str
    verdict: str  # "equal", "near-tie", "differs" or "refused"
    max_dlogprob: float
    max_gap: float
    tokens_equal: bool
    repeat_equal: bool
    cached_tokens: int  # prompt tokens the second pass read from the prefix cache
    refused: str = ""  # the engine's message, where it refused the setting
    float_floor: float | None = None  # float-noise: the float32 reference's distance from the float64 one
    dlogprob64: float | None = None  # float-noise: the engine's distance from the float64 reference

    @property
    def ok(self) -> bool:
        return self.verdict in ("equal", "near-tie", "float-noise")

    @property
    def float_noise_candidate(self) -> bool:
        """Beyond ATOL with the reference's tokens, repeated: worth asking the float64 reference."""
        return self.verdict == "differs" and self.tokens_equal and self.repeat_equal


def refusal(label: str, message: str) -> CaseVerdict:
    """A request whose setting the engine refused."""
    return CaseVerdict(label, "refused", float("nan"), float("nan"), False, False, 0, message)


def judge(
    label: str,
    engine_tokens: Sequence[int],
    engine_logprobs: Sequence[float],
    reference_tokens: Sequence[int],
    forced_logprobs: Sequence[float],
    forced_best: Sequence[float],
    repeat_tokens: Sequence[int],
    cached_tokens: int,
    atol: float = ATOL,
    tie: float = TIE,
) -> CaseVerdict:
    """Judge one request; ``forced_*`` are the reference's, teacher-forced on ``engine_tokens``."""
    if not (len(engine_tokens) == len(engine_logprobs) == len(forced_logprobs) == len(forced_best)):
        raise ValueError(
            f"{label}: {len(engine_tokens)} tokens, {len(engine_logprobs)} engine log-probs, "
            f"{len(forced_logprobs)} / {len(forced_best)} reference log-probs"
        )
    if not engine_tokens:
        raise ValueError(f"{label}: the engine produced no tokens")
    dlogprob = max(abs(a - b) for a, b in zip(engine_logprobs, forced_logprobs, strict=True))
    gap = max(best - lp for best, lp in zip(forced_best, forced_logprobs, strict=True))
    tokens_equal = list(engine_tokens) == list(reference_tokens)
    repeat_equal = list(repeat_tokens) == list(engine_tokens)
    if not repeat_equal or dlogprob > atol:
        verdict = "differs"
    elif tokens_equal:
        verdict = "equal"
    elif gap <= tie:
        verdict = "near-tie"
    else:
        verdict = "differs"
    return CaseVerdict(label, verdict, dlogprob, gap, tokens_equal, repeat_equal, cached_tokens)


def rejudge(
    case: CaseVerdict,
    engine_logprobs: Sequence[float],
    forced32: Sequence[float],
    forced64: Sequence[float],
    atol: float = ATOL,
) -> CaseVerdict:
    """A ``differs`` request with the reference's tokens, judged against the float64 reference: ``float-noise``
    when the engine is within ``atol + floor`` of it (``floor``: the float32 reference's own distance from it,
    teacher-forced on the same tokens), else unchanged."""
    if not case.float_noise_candidate:
        return case
    floor = max(abs(a - b) for a, b in zip(forced32, forced64, strict=True))
    d64 = max(abs(a - b) for a, b in zip(engine_logprobs, forced64, strict=True))
    if d64 > atol + floor:
        return CaseVerdict(**{**vars(case), "float_floor": floor, "dlogprob64": d64})
    return CaseVerdict(**{**vars(case), "verdict": "float-noise", "float_floor": floor, "dlogprob64": d64})
