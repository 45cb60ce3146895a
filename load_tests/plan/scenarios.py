"""The named load scenarios: smoke, stress (the main job), chaos (stress plus faults), chaos-lite (CI's A/B),
soak (chaos for 10 minutes, with probes), and the operations under load: redeploy, scale, autoscale, node-loss
(and redeploy-lite, the short redeploy: a long test).

A scenario is a load profile, a request mix, latency targets, and what to
do to the deployment: engine-level faults (the ``kv_faults`` patch's seeded
load failures, load delays and lying connector; a KV pool small enough for
a preemption storm), replica kills, and operations on the whole deployment
(redeploy, scale, node loss: :mod:`load_tests.plan.steps`). Faults are configured at deploy time
(``engine_overrides``), so fault scenarios need the CLI to deploy the app
itself.

``planned_faults`` is derived from those settings (never written by hand,
so it cannot drift from what is injected), and the verdict fails unless each
planned fault shows in the data (:mod:`load_tests.judge.evidence`).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

from patches.definitions.fault_config import FaultConfig, offloading_connector_config
from patches.definitions.metrics import LYING_CONNECTOR_KINDS

from .hostile import HostilePlan
from .profiles import Profile
from .slo import LOADED_SLO, Slo
from .steps import Autoscale, NodeLoss, OperationPlan, Redeploy, Scale
from .workload import Mix


class ClusterShape(BaseModel):
    """The local cluster a scenario needs, when not LocalCluster's default (one node of 8 logical CPUs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: int = Field(0, ge=0, description="worker nodes beside the head")
    head_cpus: int = Field(8, ge=1, description="the head's logical CPUs")
    worker_cpus: int = Field(4, ge=1, description="each worker's logical CPUs")
    spare_workers: int = Field(
        0,
        ge=0,
        description="workers started after the deploy, empty: room for Serve to "
        "reschedule replicas (Ray packs replicas onto the nodes it has)",
    )


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    profile: Profile
    mix: Mix = Field(default_factory=Mix)
    slo: Slo = Field(default_factory=Slo)
    faults: dict[str, Any] | None = Field(None, description="kv_faults FaultConfig for every engine")
    kv_blocks: int | None = Field(None, description="num_gpu_blocks_override: a small KV pool forces preemption")
    max_num_seqs: int | None = None
    kill_replica_at_s: float | None = Field(None, description="SIGKILL one engine replica this long into the run")
    preemption_storm: bool = Field(False, description="the KV pool is sized for a preemption storm: it must happen")
    probes: bool = Field(
        False,
        description="greedy probe set sent during the load and compared with a fault-free "
        "deployment of the same config (load_tests.judge.probes)",
    )
    operations: OperationPlan | None = Field(
        None, description="redeploy / scale / node loss during the load (load_tests.operate); the load stops after them"
    )
    cluster: ClusterShape | None = Field(None, description="the local cluster's nodes (default: one)")
    hostile: HostilePlan | None = Field(
        None,
        description="hostile requests and connections beside the load, in "
        "calm and hostile windows (load_tests.plan.hostile)",
    )
    autoscaling: dict[str, Any] | None = Field(
        None,
        description="the engine deployment's autoscaling_config (Serve's "
        "autoscaler sizes it; engine_replicas is left unset)",
    )

    @field_validator("faults")
    @classmethod
    def _faults_are_a_fault_config(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            FaultConfig.model_validate(v)  # a misspelt key fails here, not in every engine at deploy time
        return v

    @model_validator(mode="after")
    def _hostile_windows_are_the_load(self) -> Scenario:
        return self.checked()

    def checked(self) -> Scenario:
        """This scenario, checked as a whole again (for one whose fields were set one by one): the hostile
        windows are the load's, a fixed load of exactly their length (an early end would add empty windows to
        both sides of the goodput comparison)."""
        h, p = self.hostile, self.profile
        if h is not None and (p.kind != "fixed" or p.max_requests is not None or p.duration_s != h.duration_s):
            raise ValueError(
                f"scenario {self.name}: the hostile windows ({h.windows} x {h.window_s:g} s) need a fixed "
                f"load of exactly {h.duration_s:g} s, no request count (got {p.kind}, "
                f"duration {p.duration_s}, requests {p.max_requests})"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _planned_faults_are_derived(cls, data: Any) -> Any:
        """A dumped scenario carries ``planned_faults`` (for its reader); reading it back, it must be what the
        settings give (it is never a setting of its own)."""
        if isinstance(data, dict) and "planned_faults" in data:
            data = dict(data)
            given = tuple(data.pop("planned_faults"))
            derived = cls.model_validate(data).planned_faults
            if given != derived:
                raise ValueError(f"planned_faults {given} is derived from the settings, which give {derived}")
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def planned_faults(self) -> tuple[str, ...]:
        """The faults this scenario injects, each of which the verdict requires to fire."""
        f = FaultConfig.model_validate(self.faults or {})
        planned = [
            name
            for name, on in (
                ("load_failures", f.load_failure_rate > 0),
                ("load_delays", f.load_delay_ms > 0),
                ("lying_connector", f.lying_rate > 0),
                ("preemption_storm", self.preemption_storm),
                ("replica_kill", self.kill_replica_at_s is not None),
            )
            if on
        ]
        return tuple(planned) + (self.operations.kinds if self.operations else ())

    @property
    def expected_violation_kinds(self) -> tuple[str, ...]:
        """Accounting violations the planned faults cause (tallied, not failures)."""
        return LYING_CONNECTOR_KINDS if "lying_connector" in self.planned_faults else ()

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
            kw["kv_transfer_config"] = offloading_connector_config(int(gib * (1 << 30)), self.faults)
        return kw


CHAOS_FAULTS = {"seed": 7, "load_failure_rate": 0.1, "load_delay_ms": 3, "lying_rate": 0.1}

# vLLM bench serve --dataset-name random --random-input-len 128 --random-output-len 64 --ignore-eos, as our mix
BENCH_MIX = Mix(
    fuzz=0.0,
    explicit_zero=0.0,
    shared_prefix=0.0,
    long_prompt=0.0,
    stream=1.0,
    chat=0.0,
    cancel=0.0,
    bad=0.0,
    prompt_tokens=128,
    max_tokens=(64, 64),
    ignore_eos=True,
)

CHAOS = Scenario(
    name="chaos",
    description="stress plus KV load failures and delays, a lying connector, a KV pool small enough for "
    "a preemption storm, and one replica SIGKILLed 30 s in (its replacement must come up and serve "
    "before the load ends: ~90 s under load here)",
    profile=Profile(kind="fixed", concurrency=256, duration_s=180),
    slo=LOADED_SLO,
    faults=CHAOS_FAULTS,
    kv_blocks=40,
    max_num_seqs=32,
    kill_replica_at_s=30,
    preemption_storm=True,
)

# A redeploy that forces new replicas (an engine setting) and that a client can see (a vllm_xargs key the guard
# refused before and allows after).
REDEPLOY = Redeploy(after_s=40, engine_kwargs={"kv_offloading_size": 0.2}, allow_xargs=("fuzzserve_probe",))
HOSTILE = HostilePlan()
# The operations' runs last as long as their steps: the duration is only a cap.
OPERATIONS_CAP_S = 3600  # scale's worst case: 3 steps x (wait + 480 s to converge + 2 x 180 s idle waits) + tail


def under_operations(name: str, description: str, steps: tuple, concurrency: int = 256, **kw: Any) -> Scenario:
    """A scenario that runs ``steps`` (load_tests.operate) under a fixed load, which stops after them."""
    plan = {k: kw.pop(k) for k in ("tail_s", "affinity_check", "converge_timeout_s") if k in kw}
    return Scenario(
        name=name,
        description=description,
        profile=Profile(kind="fixed", concurrency=concurrency, duration_s=OPERATIONS_CAP_S),
        operations=OperationPlan(steps=steps, **plan),
        **kw,
    )


SCENARIOS: dict[str, Scenario] = {
    "smoke": Scenario(
        name="smoke",
        description="16 concurrent requests for 40 s, the full request mix, a KV pool small enough that "
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
        slo=LOADED_SLO,
    ),
    "bench": Scenario(
        name="bench",
        description="vLLM bench serve's workload, for comparing figures with it: unfuzzed streamed completions "
        "of 128 random prompt tokens and exactly 64 output tokens (ignore_eos), 32 in flight, 640 "
        "requests, the deployment's own KV pool",
        profile=Profile(kind="fixed", concurrency=32, max_requests=640),
        mix=BENCH_MIX,
    ),
    "chaos": CHAOS,
    "chaos-lite": CHAOS.model_copy(
        update=dict(
            name="chaos-lite",
            description="CI's A/B through Serve: the chaos faults (load failures and delays, a lying connector, a "
            "preemption storm) at 24 concurrent requests for 60 s, no replica kill; passes with the "
            "patches, fails with --patches-off accounting",
            profile=Profile(kind="fixed", concurrency=24, duration_s=60),
            # More of the load on more shared prefixes than the pool holds (8 x ~5 blocks > 32), and longer
            # answers: a minute is enough for reloads from the offload tier (where loads fail) and preemptions.
            mix=Mix(shared_prefix=0.7, n_prefixes=8, max_tokens=(16, 96)),
            kv_blocks=32,
            max_num_seqs=16,
            kill_replica_at_s=None,
        )
    ),
    "soak": CHAOS.model_copy(
        update=dict(
            name="soak",
            description="chaos for 10 minutes at 256 concurrent streams, with a greedy probe set sent under the "
            "faults and compared with a fault-free deployment (docs/load_tests.md, the soak figure)",
            profile=Profile(kind="fixed", concurrency=256, duration_s=600),
            mix=Mix(stream=1.0),
            kill_replica_at_s=120,
            probes=True,
        )
    ),
    "redeploy": under_operations(
        "redeploy",
        "256 concurrent streams on 2 replicas; 40 s in, serve deploy of the app with a changed engine "
        "setting (kv_offloading_size, so Serve replaces every replica) and a newly allowed vllm_xargs "
        "key (a probe sees it refused before, accepted after); the load runs until the new replicas "
        "serve, plus 45 s. Nothing lost, no 5xx, old replicas retired cleanly",
        (REDEPLOY,),
        slo=LOADED_SLO,
    ),
    "redeploy-lite": under_operations(
        "redeploy-lite",
        "the short redeploy (a long test): 16 concurrent requests on 2 replicas, the redeploy 15 s in, the load until "
        "the new replicas serve plus 15 s",
        (REDEPLOY.model_copy(update={"after_s": 15}),),
        concurrency=16,
        tail_s=15,
    ),
    "scale": under_operations(
        "scale",
        "256 concurrent streams while the engine deployment scales 2 -> 4 -> 1 -> 2 replicas "
        "(num_replicas in the YAML's deployments: section, changed in place), each step 40-60 s "
        "after the previous one converged; nothing lost, no 5xx, retired replicas not deaths; after "
        "each step the load pauses and each fuzz setting + prefix must land on the replica the router's "
        "hash names among those now serving",
        (Scale(after_s=40, replicas=4), Scale(after_s=60, replicas=1), Scale(after_s=60, replicas=2)),
        slo=LOADED_SLO,
        affinity_check=True,
    ),
    "node-loss": under_operations(
        "node-loss",
        "256 concurrent streams on a three-node cluster (head and worker1 with one replica each, "
        "worker2 empty, started after the deploy); 40 s in, every process of worker1 is SIGKILLed; "
        "Serve must bring a replacement up on a surviving node; only the requests cut by the loss may "
        "fail, and the lost node's endpoint and series are declared, not violations",
        (NodeLoss(after_s=40),),
        slo=LOADED_SLO,
        # the replacement starts on a node that never ran a replica, under the full load: 303, 435 and 488 s measured
        converge_timeout_s=720,
        # 2 CPUs a node: one replica each (a replica takes its engine core + its frontend's); Ray would pack both
        # onto a bigger head. The spare node is where the replacement can go.
        cluster=ClusterShape(workers=1, head_cpus=2, worker_cpus=2, spare_workers=1),
    ),
    "hostile": Scenario(
        name="hostile",
        description="64 concurrent requests of the normal mix for 4 minutes in 30 s windows, calm and hostile in "
        "ABBA order; a hostile window adds hostile requests (a fifth of its requests: coerced caps, "
        "prompt lists, limit headers, costly grammars; each must get its 400 naming the field or "
        "header) and opens idle, header-trickling and never-read connections (each must be closed by "
        "the server within its bound); the normal clients' goodput in hostile windows may fall at most "
        "10 % below the calm windows' (docs/security.md, the hostile scenario)",
        profile=Profile(kind="fixed", concurrency=64, duration_s=HOSTILE.duration_s),
        mix=Mix(bad=0.0),
        slo=LOADED_SLO,
        hostile=HOSTILE,
    ),
    "hostile-aa": Scenario(
        name="hostile-aa",
        description="the hostile scenario's load and windows with nothing hostile in them: the A/A control of its "
        "goodput comparison (the drop it shows is the host's noise)",
        profile=Profile(kind="fixed", concurrency=64, duration_s=HOSTILE.duration_s),
        mix=Mix(bad=0.0),
        slo=LOADED_SLO,
        hostile=HOSTILE.model_copy(update={"share": 0.0, "connections": 0}),
    ),
    "hostile-heavy": Scenario(
        name="hostile-heavy",
        description="the positive control of the hostile scenario's goodput check: its load and windows, the hostile "
        "share made of legal requests as costly as the guard admits (2 prompts x n 8, 96 tokens each, "
        "answered 200), no hostile connection; the run must fail, naming the normal clients' goodput drop",
        profile=Profile(kind="fixed", concurrency=64, duration_s=HOSTILE.duration_s),
        mix=Mix(bad=0.0),
        slo=LOADED_SLO,
        hostile=HOSTILE.model_copy(update={"requests": "heavy", "connections": 0}),
    ),
    "autoscale": under_operations(
        "autoscale",
        "Serve's autoscaler sizes the engine deployment (1 to 2 replicas, 32 ongoing requests per "
        "replica as the target): 16 concurrent requests, then 256 until it runs 2 replicas, then 16 "
        "until it is back to 1; nothing lost, no 5xx, the retired replica not a death",
        (Autoscale(after_s=60, concurrency=256, replicas=2), Autoscale(after_s=60, concurrency=16, replicas=1)),
        concurrency=16,
        slo=LOADED_SLO,
        autoscaling={
            "min_replicas": 1,
            "max_replicas": 2,
            "initial_replicas": 1,
            "target_ongoing_requests": 32,
            "upscale_delay_s": 10,
            "downscale_delay_s": 30,
        },
    ),
}
