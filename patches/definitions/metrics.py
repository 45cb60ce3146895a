"""What the patches export, by name: the counters and the values of their ``kind`` label.

One definition for the patches that export them (``accounting``, ``kv_faults``)
and for everything that reads them (``load_tests``, ``monitoring``). Pure
data: importing it imports no vLLM.
"""

from __future__ import annotations

# The accounting patch: something was wrong and was clamped / stats corrected where the truth is known.
VIOLATIONS_METRIC = "vllm:prompt_token_accounting_violations"
CORRECTIONS_METRIC = "vllm:prompt_token_accounting_corrections"
# The kv_faults patch: every fault it injected.
INJECTIONS_METRIC = "vllm:kv_fault_injections"

# Violations of a connector's matched-token report (checked before the scheduler uses it).
CONNECTOR_VIOLATION_KINDS = (
    "connector_negative",
    "connector_exceeds_prompt",
    "connector_invalid",
    "connector_async_without_tokens",
)
# Every accounting violation kind, each exported at 0 from the start.
VIOLATION_KINDS = (
    *CONNECTOR_VIOLATION_KINDS,
    "prefill_stats_inconsistent",
    "prefill_finalize_negative",
    "frontend_prefill_stats_inconsistent",
    "negative_increment",
)
CORRECTION_KINDS = ("after_load_failure", "after_preemption")
# What a lying connector reported: a negative count, one beyond the prompt, or a count that changes between
# calls for the same request.
LIE_KINDS = ("lie_negative", "lie_exceeds_prompt", "lie_changing")
INJECTION_KINDS = ("load_failure", "load_delay", *LIE_KINDS)

# The violations a lying connector causes, which the accounting patch clamps: its reports, and the prefill
# stats set from them.
LYING_CONNECTOR_KINDS = (*CONNECTOR_VIOLATION_KINDS, "prefill_stats_inconsistent")
# Lies the accounting patch must clamp, and the violation each is counted as (a "changing" lie reports a
# possible count: nothing to clamp).
IMPOSSIBLE_LIES = {"lie_negative": "connector_negative", "lie_exceeds_prompt": "connector_exceeds_prompt"}
