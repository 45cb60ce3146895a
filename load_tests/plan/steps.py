"""The operation steps a scenario can run under load, as data: redeploy, scale, autoscale, node loss.

A plan (:class:`OperationPlan`) is a sequence of steps run one after
another beside the load; each waits ``after_s`` (after the load started, or
after the previous step converged). How each is carried out, when it has
converged and how its evidence is judged is :mod:`load_tests.operate.steps`'
business; what a run records of each is an event
(:mod:`load_tests.results.events`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    after_s: float = Field(
        ge=0, description="seconds after the load started (first step) or the previous step converged"
    )


class Redeploy(_Step):
    kind: Literal["redeploy"] = "redeploy"
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="merged into every llm_config's engine_kwargs (any change "
        "under the app's args makes Serve replace every replica)",
    )
    allow_xargs: tuple[str, ...] = Field(
        (),
        description="vllm_xargs keys the guard allows after the redeploy (refused before): the change a probe can see",
    )


class Scale(_Step):
    kind: Literal["scale"] = "scale"
    replicas: int = Field(ge=1, description="the engine deployment's num_replicas (changed in place)")


class Autoscale(_Step):
    kind: Literal["autoscale"] = "autoscale"
    concurrency: int = Field(ge=1, description="the load's requests in flight from this step on")
    replicas: int = Field(ge=1, description="the replicas Serve's autoscaler must reach at that load")


class NodeLoss(_Step):
    kind: Literal["node_loss"] = "node_loss"
    node: str = Field("worker1", description="the local cluster's node to kill (a worker: the head holds Serve)")


Operation = Annotated[Redeploy | Scale | Autoscale | NodeLoss, Field(discriminator="kind")]


class OperationPlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: tuple[Operation, ...] = Field(min_length=1)
    converge_timeout_s: float = Field(480.0, gt=0, description="a step that has not converged by then fails the run")
    tail_s: float = Field(45.0, ge=0, description="load after the last step converged")
    probe_every_s: float = Field(5.0, gt=0, description="between guard probes (plans with allow_xargs)")
    affinity_check: bool = Field(
        False,
        description="after each scale step converged: pause the load and check that "
        "a fuzz setting + prefix lands on the replica the router's hash "
        "names (load_tests.operate.affinity)",
    )
    affinity_idle_timeout_s: float = Field(180.0, gt=0, description="for the paused deployment to go idle")

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.kind for s in self.steps))

    @property
    def changes_load(self) -> bool:
        return any(isinstance(s, Autoscale) for s in self.steps)

    @property
    def probe_key(self) -> str | None:
        """The vllm_xargs key the probes send: the first a redeploy newly allows."""
        return next((k for s in self.steps if isinstance(s, Redeploy) for k in s.allow_xargs), None)
