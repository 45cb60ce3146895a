"""Patch ``accounting``: prompt-token accounting that can never feed a negative amount to a counter.

What it changes
    EngineCore (scheduler):
    * the KV connector's matched-token report (``get_num_new_matched_tokens``
      on the scheduler's connector instance) is checked before the scheduler
      uses it: a negative count, a count beyond ``num_tokens - local``, a
      non-integer, or an async load of 0 tokens becomes 0 (recompute; always
      safe) and is counted as a violation. Upstream trusts it; a bad one trips
      ``assert num_computed_tokens <= request.num_tokens`` or
      ``assert num_external_computed_tokens > 0`` (EngineCore dies) or flows
      negative into the stats;
    * ``PrefillStats.set`` / ``finalize`` clamp instead of asserting (an
      assert there kills EngineCore: ``EngineDeadError`` for every request);
    * after invalid-block truncation (``_update_requests_with_invalid_blocks``,
      policy ``recompute``) the request's stats are corrected to what was
      really loaded (upstream keeps the optimistic external count);
    * a request preempted before its first output gets its stats re-taken
      at re-admission (upstream keeps those of its first admission), through
      the admission's ``allocate_slots`` call, which carries the final local
      and external counts.
    Frontend (stat loggers):
    * ``PromptTokenStats.update_from_output`` checks each request's
      ``PrefillStats`` (non-negative parts that sum to the prompt) and
      sanitizes a bad one;
    * every counter that ``PrometheusStatLogger`` (and so
      ``RayPrometheusStatLogger``) creates refuses negative or non-finite
      increments (prometheus_client and Ray raise on them, which kills vLLM's
      output handler);
    * two new counters: ``vllm:prompt_token_accounting_violations_total{kind}``
      (something was wrong and was clamped) and
      ``vllm:prompt_token_accounting_corrections_total{kind}`` (stats were
      corrected where the truth is known: ``after_load_failure``,
      ``after_preemption``). Each violation kind is logged once per process
      with its diagnostics. EngineCore's counts reach the frontend inside the
      per-step ``SchedulerStats`` (keys prefixed ``fuzzserve.`` in
      ``num_kv_fetch_reqs_by_stage``, removed before any logger sees them).

Why
    vLLM issue #36533: under high concurrency with KV offloading the engine
    crashed with "Counters can only be incremented by non-negative amounts".
    The invariant, per request and so per counter, at every point and
    whatever a connector reports::

        0 <= local_cache_hit, 0 <= external_kv_transfer,
        local_cache_hit + external_kv_transfer + local_compute == prompt_tokens

    docs/accounting.md explains which number means what and where it is set.

Upstream
    Issue vllm-project/vllm#36533; PR #36638 (closed: clamp after invalid-block
    subtraction, reset stale cached counts on preemption/retry, guards in the
    stats); PR #36812 (invariant check at the stats boundary, not merged);
    refactor #37460 (``PrefillStats``, in 0.32).

Verified on
    vLLM 0.32.0.

Remove when
    Upstream validates connector reports, re-takes prefill stats after
    preemption and invalid-block truncation, and guards the counters.
"""

from __future__ import annotations

import math
import threading
from collections import Counter as _Tally
from typing import Any

from .definitions.metrics import CORRECTION_KINDS, CORRECTIONS_METRIC, VIOLATION_KINDS, VIOLATIONS_METRIC
from .framework._core import logger
from .framework.registry import Patch, Target

log = logger()

_WIRE_PREFIX = "fuzzserve."  # keys in SchedulerStats.num_kv_fetch_reqs_by_stage
_V, _C = "v:", "c:"

# Per process: counts not yet shipped (EngineCore) or not yet recorded (frontend). Counted on the thread that finds
# the fault and taken by the one that records (the stats_thread patch's, in an async frontend), so under a lock.
_pending: _Tally[str] = _Tally()
_pending_lock = threading.Lock()
_logged_kinds: set[str] = set()


def _add_pending(key: str, n: int = 1) -> None:
    with _pending_lock:
        _pending[key] += n


def _take_pending() -> dict[str, int]:
    """Every pending count, removed (an empty dict, without the lock, when there is none)."""
    if not _pending:
        return {}
    with _pending_lock:
        taken = dict(_pending)
        _pending.clear()
    return taken


def record_violation(kind: str, **diagnostics: Any) -> None:
    _add_pending(_V + kind)
    if kind not in _logged_kinds:
        _logged_kinds.add(kind)
        log.warning(
            "accounting: %s clamped (logged once per kind; counted in %s_total): %s",
            kind,
            VIOLATIONS_METRIC,
            diagnostics,
        )


def record_correction(kind: str, **diagnostics: Any) -> None:
    _add_pending(_C + kind)
    log.debug("accounting: corrected %s: %s", kind, diagnostics)


def _clamp(x: int, lo: int, hi: int) -> int:
    return max(lo, min(int(x), hi))


def sanitize_split(prompt: Any, local: Any, external: Any) -> tuple[int, int, int, bool]:
    """(prompt, local, external, changed): non-negative, local + external <= prompt."""
    try:
        p = max(0, int(prompt))
        lo = _clamp(local, 0, p)
        ex = _clamp(external, 0, p - lo)
    except (TypeError, ValueError, OverflowError):
        return max(0, int(prompt) if isinstance(prompt, int) else 0), 0, 0, True
    return p, lo, ex, (p, lo, ex) != (prompt, local, external)


# --------------------------------------------------------------------------
# EngineCore: PrefillStats
# --------------------------------------------------------------------------


def _wrap_set(original):
    def set(self, num_prompt_tokens, num_local_cached_tokens, num_external_cached_tokens):
        p, lo, ex, changed = sanitize_split(num_prompt_tokens, num_local_cached_tokens, num_external_cached_tokens)
        if changed:
            record_violation(
                "prefill_stats_inconsistent",
                prompt=num_prompt_tokens,
                local=num_local_cached_tokens,
                external=num_external_cached_tokens,
            )
        return original(self, p, lo, ex)

    return set


def _wrap_finalize(original):
    def finalize(self, num_cached_tokens):
        if not isinstance(num_cached_tokens, int) or num_cached_tokens < 0:
            record_violation("prefill_finalize_negative", num_cached_tokens=num_cached_tokens)
            num_cached_tokens = 0
        return original(self, num_cached_tokens)

    return finalize


# --------------------------------------------------------------------------
# EngineCore: the scheduler
# --------------------------------------------------------------------------


def checked_connector_report(request: Any, num_computed_tokens: int, reported: Any, load_async: bool):
    """The connector's (count, async) if possible for this request, else (0, False) and a violation."""
    if reported is None:  # "ask again later": legitimate
        return reported, load_async
    # The scheduler's own bound (it asserts local + external <= num_tokens); a
    # full hit is legal: the scheduler then recomputes the last token itself.
    cap = max(0, request.num_tokens - num_computed_tokens)
    if not isinstance(reported, int) or isinstance(reported, bool):
        kind = "connector_invalid"
    elif reported < 0:
        kind = "connector_negative"
    elif reported > cap:
        kind = "connector_exceeds_prompt"
    elif reported == 0 and load_async:
        kind = "connector_async_without_tokens"  # the scheduler asserts this away
    else:
        return reported, load_async
    record_violation(
        kind,
        request_id=request.request_id,
        reported=reported,
        num_tokens=request.num_tokens,
        local_computed=num_computed_tokens,
        max_possible=cap,
    )
    return 0, False


def _wrap_connector_report(report):
    """The scheduler's connector's ``get_num_new_matched_tokens`` (bound), checked: see
    :func:`checked_connector_report`."""

    def get_num_new_matched_tokens(request, num_computed_tokens, *args, **kwargs):
        n, load_async = report(request, num_computed_tokens, *args, **kwargs)
        return checked_connector_report(request, num_computed_tokens, n, load_async)

    return get_num_new_matched_tokens


def _wrap_allocate_slots(allocate):
    """The scheduler's KV cache manager's ``allocate_slots`` (bound): a request preempted before its first output
    gets its prefill stats re-taken at re-admission, from the final local and external counts."""

    def allocate_slots(request, *args, **kwargs):
        blocks = allocate(request, *args, **kwargs)
        if (
            blocks is not None
            and getattr(request, "_fuzzserve_restat", False)
            and request.prefill_stats is not None
            and "num_new_computed_tokens" in kwargs
        ):
            request._fuzzserve_restat = False
            local = kwargs.get("num_new_computed_tokens", 0)
            external = kwargs.get("num_external_computed_tokens", 0)
            before = (request.prefill_stats.num_local_cached_tokens, request.prefill_stats.num_external_cached_tokens)
            request.prefill_stats.set(request.num_prompt_tokens, local, external)
            if before != (local, external):
                record_correction(
                    "after_preemption", request_id=request.request_id, before=before, after=(local, external)
                )
        return blocks

    return allocate_slots


def _instrument_scheduler(scheduler: Any) -> None:
    """The run-time rebinds on one scheduler's parts (its connector, if any, and its KV cache manager)."""
    connector = getattr(scheduler, "connector", None)
    if connector is not None:
        PATCH.target(CONNECTOR_REPORT).apply_to(connector)
    PATCH.target(ALLOCATE_SLOTS).apply_to(scheduler.kv_cache_manager)


def _wrap_scheduler_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _instrument_scheduler(self)

    return __init__


def _wrap_preempt(original):
    def _preempt_request(self, request, *args, **kwargs):
        result = original(self, request, *args, **kwargs)
        if request.prefill_stats is not None:  # preempted before its first output
            request._fuzzserve_restat = True
        return result

    return _preempt_request


def _wrap_invalid_blocks(original):
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens, *args, **kwargs):
        requests = list(requests)
        result = original(self, requests, invalid_block_ids, num_scheduled_tokens, *args, **kwargs)
        affected = result[0]
        for request in requests:
            stats = request.prefill_stats
            if request.request_id not in affected or stats is None:
                continue
            valid = max(0, request.num_computed_tokens)
            local = min(stats.num_local_cached_tokens, valid)
            external = max(0, min(stats.num_external_cached_tokens, valid - local))
            if (local, external) != (stats.num_local_cached_tokens, stats.num_external_cached_tokens):
                record_correction(
                    "after_load_failure",
                    request_id=request.request_id,
                    before=(stats.num_local_cached_tokens, stats.num_external_cached_tokens),
                    after=(local, external),
                )
                stats.set(stats.num_prompt_tokens, local, external)
        return result

    return _update_requests_with_invalid_blocks


def _wrap_make_stats(original):
    def make_stats(self, *args, **kwargs):
        stats = original(self, *args, **kwargs)
        if stats is not None and _pending:
            wire = stats.num_kv_fetch_reqs_by_stage
            for key, n in _take_pending().items():
                wire[_WIRE_PREFIX + key] = wire.get(_WIRE_PREFIX + key, 0) + n
        return stats

    return make_stats


# --------------------------------------------------------------------------
# Frontend: stat loggers
# --------------------------------------------------------------------------


def checked_prefill_stats(stats: Any) -> Any:
    """``stats`` if its parts are non-negative and sum to the prompt, else a sanitized copy."""
    p, lo, ex = stats.num_prompt_tokens, stats.num_local_cached_tokens, stats.num_external_cached_tokens
    ok = (
        p >= 0
        and lo >= 0
        and ex >= 0
        and lo + ex <= p
        and stats.num_computed_tokens == p - lo - ex
        and stats.num_cached_tokens == lo + ex
    )
    if ok:
        return stats
    record_violation(
        "frontend_prefill_stats_inconsistent",
        prompt=p,
        local=lo,
        external=ex,
        computed=stats.num_computed_tokens,
        cached=stats.num_cached_tokens,
    )
    fixed = type(stats)()
    sp, slo, sex, _ = sanitize_split(p, lo, ex)
    fixed.set(sp, slo, sex)
    return fixed


def _wrap_prompt_token_update(original):
    def update_from_output(self, prefill_stats):
        return original(self, checked_prefill_stats(prefill_stats))

    return update_from_output


_guarded_classes: dict[type, type] = {}


def guarded_counter_cls(cls: type[Any]) -> type:
    """A subclass of a counter class (prometheus_client's or Ray's wrapper) whose
    ``inc`` drops negative or non-finite amounts and counts them as violations.
    Labelled children are created through ``type(self)``/``copy``, so they are
    guarded too."""
    if cls not in _guarded_classes:

        def inc(self, amount=1, *args, **kwargs):
            try:
                bad = not math.isfinite(amount) or amount < 0
            except TypeError:
                bad = True
            if bad:
                record_violation(
                    "negative_increment",
                    metric=getattr(self, "_name", None) or getattr(getattr(self, "metric", None), "_name", None),
                    amount=amount,
                )
                return None
            return cls.inc(self, amount, *args, **kwargs)

        _guarded_classes[cls] = type(f"NonNegative{cls.__name__}", (cls,), {"inc": inc, "__module__": __name__})
    return _guarded_classes[cls]


def _wrap_logger_init(original):
    def __init__(self, vllm_config, *args, **kwargs):
        PATCH.target(COUNTER_CLS).apply_to(self)  # every counter it creates is guarded
        original(self, vllm_config, *args, **kwargs)
        labelnames = ["model_name", "engine", "kind"]
        self._fuzzserve_model_name = vllm_config.model_config.served_model_name
        self._fuzzserve_violations = self._counter_cls(
            name=VIOLATIONS_METRIC,
            labelnames=labelnames,
            documentation="Prompt-token accounting inputs that broke an invariant and were clamped, by kind.",
        )
        self._fuzzserve_corrections = self._counter_cls(
            name=CORRECTIONS_METRIC,
            labelnames=labelnames,
            documentation="Prompt-token stats corrected where the truth is known (after a load failure or a "
            "preemption), by kind.",
        )
        # Export every known kind at 0 from the start: "present and 0" tells a
        # monitor the patch is on; an absent series cannot tell it anything.
        for idx in getattr(self, "engine_indexes", [0]):
            for counter, kinds in (
                (self._fuzzserve_violations, VIOLATION_KINDS),
                (self._fuzzserve_corrections, CORRECTION_KINDS),
            ):
                for kind in kinds:
                    counter.labels(model_name=self._fuzzserve_model_name, engine=str(idx), kind=kind)

    return __init__


def _drain_wire(scheduler_stats: Any) -> None:
    """Move EngineCore's shipped counts out of SchedulerStats into this process's tally."""
    wire = getattr(scheduler_stats, "num_kv_fetch_reqs_by_stage", None)
    if not wire:
        return
    for key in [k for k in wire if k.startswith(_WIRE_PREFIX)]:
        _add_pending(key[len(_WIRE_PREFIX) :], wire.pop(key))


def _wrap_manager_record(original):
    def record(self, scheduler_stats, *args, **kwargs):
        if scheduler_stats is not None:
            _drain_wire(scheduler_stats)
        return original(self, scheduler_stats, *args, **kwargs)

    return record


def _wrap_logger_record(original):
    def record(self, scheduler_stats, iteration_stats, *args, **kwargs):
        if scheduler_stats is not None:
            _drain_wire(scheduler_stats)  # when used without a StatLoggerManager
        result = original(self, scheduler_stats, iteration_stats, *args, **kwargs)
        engine_idx = kwargs.get("engine_idx", args[1] if len(args) > 1 else 0) or 0
        if _pending and hasattr(self, "_fuzzserve_violations"):
            for key, n in _take_pending().items():
                counter = self._fuzzserve_violations if key.startswith(_V) else self._fuzzserve_corrections
                counter.labels(model_name=self._fuzzserve_model_name, engine=str(engine_idx), kind=key[2:]).inc(n)
        return result

    return record


_SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
_STATS = "vllm.v1.metrics.stats"
_LOGGERS = "vllm.v1.metrics.loggers"
CONNECTOR_REPORT = "vllm.distributed.kv_transfer.kv_connector.v1.base:KVConnectorBase_V1.get_num_new_matched_tokens"
ALLOCATE_SLOTS = "vllm.v1.core.kv_cache_manager:KVCacheManager.allocate_slots"
COUNTER_CLS = f"{_LOGGERS}:PrometheusStatLogger._counter_cls"

PATCH = Patch(
    __doc__,
    (
        Target(
            f"{_STATS}:PrefillStats.set",
            "wrap",
            make=_wrap_set,
            params=("num_prompt_tokens", "num_local_cached_tokens", "num_external_cached_tokens"),
            why="clamp instead of asserting (an assert kills EngineCore)",
        ),
        Target(
            f"{_STATS}:PrefillStats.finalize",
            "wrap",
            make=_wrap_finalize,
            params=("num_cached_tokens",),
            why="clamp a negative cached count instead of asserting",
        ),
        Target(
            f"{_SCHEDULER}.__init__",
            "wrap",
            make=_wrap_scheduler_init,
            attrs=("connector", "kv_cache_manager"),
            why="installs the two rebinds below on each scheduler's connector and KV cache manager",
        ),
        Target(
            CONNECTOR_REPORT,
            "rebind",
            make=_wrap_connector_report,
            params=("request", "num_computed_tokens"),
            applied_by=f"{_SCHEDULER}.__init__",
            why="the connector's matched-token report checked before the scheduler uses it (an impossible one "
            "becomes 0: recompute), whatever the connector",
        ),
        Target(
            ALLOCATE_SLOTS,
            "rebind",
            make=_wrap_allocate_slots,
            params=("request",),
            keywords=("num_new_computed_tokens", "num_external_computed_tokens"),
            applied_by=f"{_SCHEDULER}.__init__",
            why="a request preempted before its first output gets its prefill stats re-taken at re-admission",
        ),
        Target(
            f"{_SCHEDULER}._preempt_request",
            "wrap",
            make=_wrap_preempt,
            params=("request",),
            why="marks a request preempted before its first output, for the re-take at re-admission",
        ),
        Target(
            f"{_SCHEDULER}._update_requests_with_invalid_blocks",
            "wrap",
            make=_wrap_invalid_blocks,
            params=("requests", "invalid_block_ids", "num_scheduled_tokens"),
            why="after invalid-block truncation the request's stats are corrected to what was really loaded",
        ),
        Target(
            f"{_SCHEDULER}.make_stats",
            "wrap",
            make=_wrap_make_stats,
            why="ships EngineCore's violation and correction counts to the frontend inside SchedulerStats",
        ),
        Target(
            f"{_STATS}:PromptTokenStats.update_from_output",
            "wrap",
            make=_wrap_prompt_token_update,
            params=("prefill_stats",),
            why="frontend: each request's PrefillStats checked, a bad one sanitized",
        ),
        Target(
            f"{_LOGGERS}:PrometheusStatLogger.__init__",
            "wrap",
            make=_wrap_logger_init,
            params=("vllm_config",),
            attrs=("engine_indexes",),
            why="guarded counters, and the violations and corrections counters",
        ),
        Target(
            COUNTER_CLS,
            "class_swap",
            make=guarded_counter_cls,
            applied_by=f"{_LOGGERS}:PrometheusStatLogger.__init__",
            why="every counter the logger creates refuses negative or non-finite increments (they raise, and kill "
            "vLLM's output handler)",
        ),
        Target(
            f"{_LOGGERS}:PrometheusStatLogger.record",
            "wrap",
            make=_wrap_logger_record,
            params=("scheduler_stats", "iteration_stats", "mm_cache_stats", "engine_idx"),
            why="records the shipped violation and correction counts",
        ),
        Target(
            f"{_LOGGERS}:StatLoggerManager.record",
            "wrap",
            make=_wrap_manager_record,
            params=("scheduler_stats",),
            why="takes EngineCore's counts out of SchedulerStats before any logger sees them",
        ),
    ),
)
