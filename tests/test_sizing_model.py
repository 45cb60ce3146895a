"""The untrained sizing model (``fixture_model.sizing``): shapes, refusals, a checkpoint transformers loads."""

from __future__ import annotations

import json

import pytest

from fixture_model import build, sizing


@pytest.mark.parametrize("text, want", [("1024x4", (1024, 4)), (" 64x1 ", (64, 1)), ("4096x32", (4096, 32))])
def test_parse_arch(text, want):
    assert sizing.parse_arch(text) == want


@pytest.mark.parametrize(
    "text, field",
    [
        ("1024", "HIDDENxLAYERS"),
        ("100x4", "multiple of 64"),
        ("0x4", "multiple of 64"),
        ("1024x0", "layers"),
        ("1024x65", "layers"),
    ],
)
def test_parse_arch_refuses_shapes_the_cpu_backend_cannot_run(text, field):
    with pytest.raises(ValueError, match=field):
        sizing.parse_arch(text)


def test_llama_proportions():
    c = sizing.config_for(1024, 4)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (16, 4, 64)
    assert c["intermediate_size"] == 2816 and c["num_hidden_layers"] == 4
    assert sizing.config_for(64, 1)["num_key_value_heads"] == 1


def test_build_is_cached_and_loads(tmp_path, monkeypatch):
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    path = sizing.ensure_sizing_model(128, 1)
    assert path.parent == tmp_path and path.name.startswith("sizing-llama-128x1-")
    mtime = (path / "config.json").stat().st_mtime_ns
    assert sizing.ensure_sizing_model(128, 1) == path and (path / "config.json").stat().st_mtime_ns == mtime
    config = AutoConfig.from_pretrained(path)
    assert (config.hidden_size, config.num_hidden_layers, config.head_dim) == (128, 1, 64)
    assert json.loads((path / "sizing_build.json").read_text())["trained"] is False
    tok = AutoTokenizer.from_pretrained(path)
    text = tok.decode(tok("count 3 4 5")["input_ids"], skip_special_tokens=True)
    assert isinstance(text, str) and text.strip() == "count 3 4 5"
