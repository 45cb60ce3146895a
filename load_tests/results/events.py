"""What a run did on purpose, as events: a discriminated union on ``kind``.

Every event explains something in the data: a killed replica's cut streams,
the replicas an operation retired, the node whose endpoint went silent.
The judge reads them (:mod:`load_tests.judge`), the report plots them, and
``summary.json`` carries them under ``faults`` (one object per event, its
``kind`` first). Each kind has its own typed fields; there is no bag of
keys to interpret again.

========================= ======================================================
kind                      event
========================= ======================================================
``replica_kill``          :class:`ReplicaKilled`: the run SIGKILLed a replica
``redeploy``              :class:`Redeployed`: a ``serve deploy`` of a changed config
``scale``                 :class:`Scaled`: ``num_replicas`` changed in place
``autoscale``             :class:`Autoscaled`: the load changed; Serve's autoscaler follows
``node_loss``             :class:`NodeLost`: every process of a worker node SIGKILLed
``operation_failed``      :class:`OperationFailed`: a step could not be carried out
========================= ======================================================
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ..plan.steps import Autoscale, NodeLoss, Redeploy, Scale
from .base import Record


class _Event(Record):
    t: float = Field(description="seconds since the run started")


class ReplicaKilled(_Event):
    kind: Literal["replica_kill"] = "replica_kill"
    replica: str = Field(description="the ReplicaId killed")
    pid: int


class OperationFailed(_Event):
    kind: Literal["operation_failed"] = "operation_failed"
    step: str = Field(description="the kind of the step that could not be carried out")
    error: str


class GuardProbe(Record):
    """One of a redeploy's probes: a tiny completion with the vllm_xargs key the redeploy newly allows."""

    t: float = Field(description="sent, seconds since the run started")
    status: int | None = Field(description="None: no answer (the error says why)")
    names_key: bool = Field(description="the answer's text names the key (a 400 must)")
    answered: float = Field(description="seconds since the run started")


class AffinityKeyRecord(Record):
    xargs: dict[str, Any] | None = Field(description="the fuzz setting (vllm_xargs); None: unfuzzed")
    home: str = Field(description="the ReplicaId the router's hash names for it")
    count: int = Field(description="requests sent with it")


class AffinityRecord(Record):
    """A scale step's routing-affinity check (:mod:`load_tests.operate.affinity`)."""

    t: float
    keys: list[AffinityKeyRecord]
    before: dict[str, float] = Field(description="each live replica's requests_total, idle before")
    after: dict[str, float] | None = Field(description="the same, idle after (None: never idle)")
    served: dict[str, float]
    statuses: list[int | None] | None
    paused_s: float
    problems: list[str] = Field(description="empty: every key's requests landed on its home")


class _StepEvent(_Event):
    """An operation step: what was done, and whether (and when) the replicas serving became what it asked for."""

    by: str = Field(description="how it was carried out (serve deploy, SIGKILL, the operator, ...)")
    replicas_before: list[str]
    converged: bool = False
    converged_t: float | None = None
    converge_s: float | None = None
    replicas_after: list[str] = Field(default_factory=list)
    why: str | None = Field(None, description="why it did not converge")
    ray: dict[str, Any] | None = Field(
        None, description="Ray's own view after the step (its state API and serve status, as Ray answers them)"
    )


class Redeployed(_StepEvent):
    kind: Literal["redeploy"] = "redeploy"
    step: Redeploy
    probes: list[GuardProbe] = Field(default_factory=list, description="every guard probe of the run")


class Scaled(_StepEvent):
    kind: Literal["scale"] = "scale"
    step: Scale
    affinity: AffinityRecord | None = None


class Autoscaled(_StepEvent):
    kind: Literal["autoscale"] = "autoscale"
    step: Autoscale


class NodeLost(_StepEvent):
    kind: Literal["node_loss"] = "node_loss"
    step: NodeLoss
    node: str
    pids: list[int] = Field(description="every process killed")
    endpoint: str = Field(description="the node's metrics endpoint, declared lost to the monitor")
    replicas: list[str] = Field(description="the replicas the monitor last saw on the node")


StepEvent = Redeployed | Scaled | Autoscaled | NodeLost
Event = Annotated[
    ReplicaKilled | Redeployed | Scaled | Autoscaled | NodeLost | OperationFailed, Field(discriminator="kind")
]
# The kinds whose events change the replica set (so HAProxy's router and replica lists).
REPLICA_SET_CHANGES = ("replica_kill", "redeploy", "scale", "autoscale", "node_loss")
# The kinds after which Serve stops healthy replicas on purpose (retirements, not deaths).
RETIRING = ("redeploy", "scale", "autoscale")
# The kinds that cut what is in flight on purpose. A redeploy or a scale-down explains nothing: Serve drains the
# replicas it stops, so every request must complete.
CUTTING = ("replica_kill", "node_loss")
