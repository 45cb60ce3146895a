"""The named load scenarios: smoke (CI), stress (the main job), chaos (stress plus faults).

A scenario is a load profile, a request mix, latency targets, and what to
do to the deployment: engine-level faults (the ``kv_faults`` patch's seeded
load failures, load delays and lying connector; a KV pool small enough for
a preemption storm) and replica kills. Faults are configured at deploy time
(``engine_overrides``), so chaos needs the CLI to deploy the app itself.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .profiles import Profile
from .summary import Slo
from .workload import Mix

# Every kind of accounting violation a lying connector causes and the
# accounting patch clamps (patches/accounting.py VIOLATION_KINDS).
LYING_CONNECTOR_KINDS = ("connector_negative", "connector_exceeds_prompt", "connector_invalid",
                         "connector_async_without_tokens", "prefill_stats_inconsistent")


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    profile: Profile
    mix: Mix = Field(default_factory=Mix)
    slo: dict[str, float | None] = Field(default_factory=lambda: {"ttft_s": 2.0, "tpot_s": 0.2, "e2e_s": None})
    faults: dict[str, Any] | None = Field(None, description="kv_faults FaultConfig for every engine")
    kv_blocks: int | None = Field(None, description="num_gpu_blocks_override: a small KV pool forces preemption")
    max_num_seqs: int | None = None
    kill_replica_at_s: float | None = Field(None, description="SIGKILL one engine replica this long into the run")
    expected_violation_kinds: tuple[str, ...] = ()

    def slo_obj(self) -> Slo:
        return Slo(**self.slo)

    def engine_overrides(self, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
        """The replicas' engine_kwargs for this scenario (faults need an explicit connector config)."""
        kw = copy.deepcopy(engine_kwargs)
        if self.kv_blocks:
            kw["num_gpu_blocks_override"] = self.kv_blocks
        if self.max_num_seqs:
            kw["max_num_seqs"] = self.max_num_seqs
        if self.faults:
            gib = kw.pop("kv_offloading_size", 0.25)
            kw.pop("kv_offloading_backend", None)
            kw["kv_transfer_config"] = {
                "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_load_failure_policy": "recompute",
                "kv_connector_extra_config": {"cpu_bytes_to_use": int(gib * (1 << 30)),
                                              "fuzzserve_faults": self.faults}}
        return kw


SCENARIOS: dict[str, Scenario] = {
    "smoke": Scenario(
        name="smoke",
        description="CI: 16 concurrent requests for 40 s, the full request mix, a KV pool small enough that "
                    "shared prefixes go to the offload tier and back, every invariant checked",
        profile=Profile(kind="fixed", concurrency=16, duration_s=40),
        kv_blocks=48,
    ),
    "stress": Scenario(
        name="stress",
        description="256 concurrent streams for 3 minutes on the 2-replica deployment, a KV pool that "
                    "spills shared prefixes to the offload tier",
        profile=Profile(kind="fixed", concurrency=256, duration_s=180),
        kv_blocks=96,
        slo={"ttft_s": 10.0, "tpot_s": 1.0, "e2e_s": None},
    ),
    "chaos": Scenario(
        name="chaos",
        description="stress plus KV load failures and delays, a lying connector, a KV pool small enough for "
                    "a preemption storm, and one replica SIGKILLed a minute in",
        profile=Profile(kind="fixed", concurrency=256, duration_s=180),
        slo={"ttft_s": 10.0, "tpot_s": 1.0, "e2e_s": None},
        faults={"seed": 7, "load_failure_rate": 0.1, "load_delay_ms": 3, "lying_rate": 0.1},
        kv_blocks=40,
        max_num_seqs=32,
        kill_replica_at_s=60,
        expected_violation_kinds=LYING_CONNECTOR_KINDS,
    ),
}
