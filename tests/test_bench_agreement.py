"""The stress CLI's figures agree with vLLM's own ``bench serve`` (issue: figures a user can check with the field's
tools).

Both clients drive ``testkit/echo_server.py`` with deterministic latencies
(100 ms to the first token, 10 ms between tokens) and answers whose every
token's text is empty, the shape of a fuzzed greedy answer: a client that
timed text instead of tokens would have no TTFT here and fail. The real
deployment's figure is in docs/load_tests.md (``python -m
benchmarks.bench_agreement --url ...``).
"""

from __future__ import annotations

import pytest

from benchmarks.bench_agreement import FIGURES, disagreements, main, median_pair_ratios, ratios


def test_our_cli_agrees_with_vllm_bench_serve_on_the_echo_server(tmp_path, capsys):
    # two pairs, compared as the median of each pair's ratio: a pair's runs are neighbours in time, so a burst
    # of other work on the host moves both (a single pair under a saturated host can be off by 2x)
    code = main(["--echo", "--concurrency", "8", "--requests", "96", "--input-len", "16", "--output-len", "32",
                 "--pairs", "2", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    result = json.loads((tmp_path / "agreement.json").read_text())
    ours, vllm = result["ours"], result["vllm"]  # each client's median figures
    for run in result["runs"]["ours"]:
        assert run["passed"], run["failures"]
        assert run["ttft_requests"] == 96, "every stream that produced tokens has a TTFT, empty text or not"
    assert ours["requests"] == vllm["requests"] == 192
    # the server's own latencies: 100 ms to the first token, 10 ms per token after it
    assert 0.095 < ours["ttft_p50_s"] < 0.15 and 0.0095 < ours["tpot_p50_s"] < 0.015


@pytest.mark.parametrize("figure", FIGURES)
def test_the_comparison_fails_a_figure_off_by_more_than_the_tolerance(figure):
    vllm = {"requests_per_s": 20.0, "ttft_p50_s": 0.1, "tpot_p50_s": 0.01}
    assert disagreements(ratios(dict(vllm), vllm)) == []
    assert disagreements(ratios(vllm | {figure: vllm[figure] * 1.14}, vllm)) == []
    off = disagreements(ratios(vllm | {figure: vllm[figure] * 1.2}, vllm))
    assert len(off) == 1 and off[0].startswith(figure) and "+20%" in off[0]
    missing = disagreements(ratios(vllm | {figure: None}, vllm))  # e.g. a TTFT the client never measured
    assert len(missing) == 1 and "not comparable" in missing[0]


def test_pairs_are_compared_as_the_median_of_each_pairs_ratio():
    """A drifting host moves both clients of a pair: neighbours are compared, then the median is taken."""
    base = {"requests_per_s": 20.0, "ttft_p50_s": 0.1, "tpot_p50_s": 0.01}
    vllm = [base, {k: v * 1.5 for k, v in base.items()}, base]  # the host was faster during the second pair
    ours = [dict(base), {k: v * 1.5 for k, v in base.items()}, {k: v * 1.3 for k, v in base.items()}]
    assert median_pair_ratios(ours, vllm)["requests_per_s"] == pytest.approx(1.0)
    assert disagreements(median_pair_ratios(ours, vllm)) == []
    slow = [{k: v * 0.8 for k, v in r.items()} for r in vllm]  # ours 20 % off in every pair
    assert len(disagreements(median_pair_ratios(slow, vllm))) == 3
