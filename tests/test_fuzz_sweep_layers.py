"""The fuzz sweep's depth dimension (pure logic, a stand-in generator): every (depth, mode, strength) point asked
with its ``fuzz_layer``, the report's accuracy grid and heatmap. The engine-level sweep is
tests/test_fuzz_engine.py's; the main job runs this one through the deployment."""

from __future__ import annotations

import pytest

from fixture_model.tasks import held_out_examples
from load_tests.load.fuzz_sweep import fuzz_xargs, layer_grid, parse_layers, run_sweep
from load_tests.report.markdown import sweep_lines
from load_tests.report.plots import plot_sweep_layers

SWEEPS = {"scale": [0.0, 0.5, 1.0], "gaussian": [0.0, 1.0, 10.0]}


def _generator(asked: list):
    """Answers each example correctly unless fuzzed at depth 1 or deeper with a strength of at least 1."""

    examples = held_out_examples(2)
    by_prompt = {ex.prompt: ex for ex in examples}

    def generate(prompts, xargs):
        asked.append(xargs)
        broken = bool(xargs) and xargs.get("fuzz_layer", 0) != 0 and xargs["fuzz_strength"] >= 1
        return [("nonsense" if broken else f" {by_prompt[p].answer} .", [1, 2] if broken else [3, 4]) for p in prompts]

    return generate, examples


def test_every_depth_is_swept_with_its_layer_and_the_baseline_once():
    asked: list = []
    generate, examples = _generator(asked)
    points = run_sweep(generate, examples, SWEEPS, layers=(0, 1, -1))
    assert asked[0] is None and asked.count(None) == 1  # s = 0 is the shared baseline
    assert {(x["fuzz_mode"], x["fuzz_strength"], x.get("fuzz_layer", 0)) for x in asked[1:]} == {
        (m, s, k) for k in (0, 1, -1) for m, ss in SWEEPS.items() for s in ss if s
    }
    assert "fuzz_layer" not in fuzz_xargs("scale", 0.5)  # depth 0 sends what a request without the key sends
    layers, strengths, grid = layer_grid(points, "gaussian")
    assert layers == [0, 1, -1] and strengths == [0.0, 1.0, 10.0]
    assert grid == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]


def test_the_report_shows_the_grid_and_draws_the_heatmap(tmp_path):
    generate, examples = _generator([])
    points = run_sweep(generate, examples, SWEEPS, layers=(0, 1))
    text = "\n".join(sweep_lines(points))
    assert "| fuzz_layer | 0 | 0.5 | 1 |" in text and "| 1 | 1.00 | 1.00 | 0.00 |" in text
    assert "| scale | 1 | 1 | 0.00 | 1.00 | 1.00 |" in text
    plot_sweep_layers(points, tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


@pytest.mark.parametrize("text, layers", [("0,1,-1", (0, 1, -1)), ("2", (2,)), ("0, 0, 3", (0, 3))])
def test_parse_layers(text, layers):
    assert parse_layers(text) == layers


@pytest.mark.parametrize("text", ["", "a", "1.5", ","])
def test_parse_layers_refuses(text):
    with pytest.raises(ValueError):
        parse_layers(text)
