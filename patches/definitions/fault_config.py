"""Fault-injection settings, read from the engine's KV connector config.

Off by default. Switched on per engine through
``kv_transfer_config.kv_connector_extra_config["fuzzserve_faults"]``, e.g.::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 268435456,
            "fuzzserve_faults": {"seed": 1, "load_failure_rate": 0.1, "load_delay_ms": 5}}}'

Every random decision comes from ``random.Random(seed)`` in the order the
engine makes them, so a run with the same workload and seed injects the same
faults. Pure Python: the decisions are unit-tested without vLLM.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CONFIG_KEY = "fuzzserve_faults"
LyingMode = Literal["negative", "exceeds_prompt", "changing"]


class FaultConfig(BaseModel):
    """What to inject. Validated strictly: a misspelt key is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    load_failure_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of offload loads that fail")
    load_delay_ms: float = Field(0.0, ge=0.0, description="each load completes after uniform(0, this) ms")
    lying_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of matched-token reports that lie")
    lying_modes: tuple[LyingMode, ...] = ("negative", "exceeds_prompt", "changing")

    @property
    def active(self) -> bool:
        return self.load_failure_rate > 0 or self.load_delay_ms > 0 or self.lying_rate > 0


def offloading_connector_config(cpu_bytes: int, faults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's ``kv_transfer_config`` for the offloading connector with ``cpu_bytes`` of CPU tier and, when
    ``faults`` is given, the fault injection (:class:`FaultConfig`'s keys, validated here: a misspelt key fails
    before any engine starts). Loads that fail are recomputed. The one place this dictionary is written (the load
    tests' fault scenarios and the engine tests both call it)."""
    extra: dict[str, Any] = {"cpu_bytes_to_use": int(cpu_bytes)}
    if faults:
        FaultConfig.model_validate(faults)
        extra[CONFIG_KEY] = dict(faults)
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def fault_config_from(extra_config: Any) -> FaultConfig:
    """The faults configured in a connector's ``kv_connector_extra_config``; inactive unless the key is set.

    Inert whatever the object: anything but a mapping that holds
    :data:`CONFIG_KEY` (``None``, a mapping without it, a test double such as
    a ``MagicMock`` config) means "no faults". Only a configured value is
    validated, and strictly.
    """
    if not isinstance(extra_config, Mapping) or extra_config.get(CONFIG_KEY) is None:
        return FaultConfig()
    return FaultConfig.model_validate(extra_config[CONFIG_KEY])


class LoadFaults:
    """Decides, load by load, whether it fails and how late it completes."""

    def __init__(self, config: FaultConfig):
        self.config = config
        self._rng = random.Random(config.seed)
        self.loads = 0
        self.failed = 0

    def next_load(self) -> tuple[bool, float]:
        """(fail?, delay in seconds) for the next load job."""
        self.loads += 1
        fail = self._rng.random() < self.config.load_failure_rate
        delay = self._rng.uniform(0, self.config.load_delay_ms) / 1000 if self.config.load_delay_ms else 0.0
        self.failed += fail
        return fail, delay


class LyingReports:
    """Turns a connector's true matched-token count into the lie a buggy connector tells.

    * ``negative``: a negative count;
    * ``exceeds_prompt``: more tokens than the request has;
    * ``changing``: a count that changes between calls for the same request
      (one block fewer than the truth on every other call; still a valid,
      loadable prefix, so only the accounting can go wrong).
    """

    def __init__(self, config: FaultConfig, block_size: int):
        self.config = config
        self.block_size = block_size
        self._rng = random.Random(config.seed + 1)
        self._calls: dict[str, int] = {}
        self.lies: dict[str, int] = {}
        self.last_lie: str | None = None  # the mode of the last report, when it lied

    def report(self, request_id: str, num_tokens: int, truth: int) -> int:
        self.last_lie = None
        calls = self._calls.get(request_id, 0)
        self._calls[request_id] = calls + 1
        if len(self._calls) > 100_000:  # bounded memory over long runs
            self._calls.clear()
        if not self.config.lying_modes or self._rng.random() >= self.config.lying_rate:
            return truth
        mode = self._rng.choice(self.config.lying_modes)
        if mode == "negative":
            lie = -self.block_size * (1 + self._rng.randrange(4))
        elif mode == "exceeds_prompt":
            lie = num_tokens + self.block_size * (1 + self._rng.randrange(4))
        else:  # changing
            lie = max(0, truth - self.block_size) if calls % 2 == 0 else truth
        if lie != truth:
            self.lies[mode] = self.lies.get(mode, 0) + 1
            self.last_lie = mode
        return lie
