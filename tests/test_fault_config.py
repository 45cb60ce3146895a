"""Fault-injection settings and decisions (pure logic)."""

from unittest.mock import MagicMock

import pytest
from pydantic import ValidationError

from patches.definitions.fault_config import FaultConfig, LoadFaults, LyingReports, fault_config_from


def test_off_by_default():
    assert not fault_config_from(None).active
    assert not fault_config_from({"cpu_bytes_to_use": 1}).active
    assert not fault_config_from({"fuzzserve_faults": None}).active


@pytest.mark.parametrize("config", [MagicMock(), "fuzzserve_faults", 42, ["fuzzserve_faults"]])
def test_inert_whatever_the_config_object(config):
    """Upstream's own unit tests hand the connector MagicMock configs: no faults, no validation error."""
    assert fault_config_from(config) == FaultConfig()


def test_inert_on_a_connector_config_that_is_not_a_mapping():
    """The patch's entry point reads vllm_config.kv_transfer_config.kv_connector_extra_config (any object)."""
    from patches.kv_faults import _config_of

    assert not _config_of(MagicMock()).active and not _config_of(None).active
    cfg = MagicMock()
    cfg.kv_transfer_config.kv_connector_extra_config = {"fuzzserve_faults": {"lying_rate": 0.5}}
    assert _config_of(cfg).lying_rate == 0.5, "and a real setting is still read"


@pytest.mark.parametrize(
    "bad",
    [
        {"load_failure_rate": 1.5},
        {"load_failure_rate": -0.1},
        {"lying_rate": 2},
        {"load_delay_ms": -1},
        {"lying_modes": ["sideways"]},
        {"load_failure_rte": 0.1},
    ],
)
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValidationError):
        fault_config_from({"fuzzserve_faults": bad})


def test_load_faults_are_seeded_and_near_the_rate():
    cfg = FaultConfig(seed=3, load_failure_rate=0.1, load_delay_ms=5)
    a, b = LoadFaults(cfg), LoadFaults(cfg)
    seq_a = [a.next_load() for _ in range(2000)]
    assert seq_a == [b.next_load() for _ in range(2000)]
    assert 150 < a.failed < 250 and all(0 <= d <= 0.005 for _, d in seq_a)
    assert [f for f, _ in seq_a] != [
        f for f, _ in (LoadFaults(cfg.model_copy(update={"seed": 4})).next_load() for _ in range(2000))
    ]


def test_lying_reports_tell_every_kind_of_lie():
    liar = LyingReports(FaultConfig(seed=0, lying_rate=1.0), block_size=128)
    reports = [liar.report(f"r{i % 7}", num_tokens=600, truth=384) for i in range(300)]
    assert any(r < 0 for r in reports)
    assert any(r > 600 for r in reports)
    assert any(0 <= r < 384 for r in reports)
    assert set(liar.lies) == {"negative", "exceeds_prompt", "changing"}
    negative = LyingReports(FaultConfig(seed=0, lying_rate=1.0, lying_modes=("negative",)), block_size=128)
    assert negative.report("r", 600, 384) < 0 and negative.last_lie == "negative", "the mode of each lie is told"
    honest = LyingReports(FaultConfig(seed=0, lying_rate=0.0), block_size=128)
    assert all(honest.report("r", 600, 384) == 384 for _ in range(50))
    assert honest.last_lie is None


def test_the_connector_config_is_the_one_vllm_reads_and_faults_are_validated_when_written():
    """The offloading connector's config, as the fault scenarios and the engine tests both write it (the one
    function they call): the CPU tier's bytes and the faults under CONFIG_KEY, read back by the patch's own
    reader; no faults, no key; a misspelt fault key fails at once."""
    from patches.definitions.fault_config import CONFIG_KEY, offloading_connector_config

    cfg = offloading_connector_config(256 << 20, {"seed": 7, "lying_rate": 0.1})
    assert cfg == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 268435456, CONFIG_KEY: {"seed": 7, "lying_rate": 0.1}},
    }
    assert fault_config_from(cfg["kv_connector_extra_config"]).lying_rate == 0.1
    assert CONFIG_KEY not in offloading_connector_config(1 << 20)["kv_connector_extra_config"]
    with pytest.raises(ValueError, match="lying_rat"):
        offloading_connector_config(1 << 20, {"lying_rat": 0.1})
