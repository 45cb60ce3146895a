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

from benchmarks.bench_agreement import FIGURES, disagreements, main


def test_our_cli_agrees_with_vllm_bench_serve_on_the_echo_server(tmp_path, capsys):
    code = main(["--echo", "--concurrency", "8", "--requests", "96", "--input-len", "16", "--output-len", "32",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    import json

    result = json.loads((tmp_path / "agreement.json").read_text())
    ours, vllm = result["ours"], result["vllm"]  # each client's median figures (one run each here)
    [run] = result["runs"]["ours"]
    assert run["passed"], run["failures"]
    assert ours["requests"] == vllm["requests"] == 96
    assert run["ttft_requests"] == 96, "every stream that produced tokens has a TTFT, empty text or not"
    # the server's own latencies: 100 ms to the first token, 10 ms per token after it
    assert 0.095 < ours["ttft_p50_s"] < 0.15 and 0.0095 < ours["tpot_p50_s"] < 0.015


@pytest.mark.parametrize("figure", FIGURES)
def test_the_comparison_fails_a_figure_off_by_more_than_the_tolerance(figure):
    vllm = {"requests_per_s": 20.0, "ttft_p50_s": 0.1, "tpot_p50_s": 0.01}
    assert disagreements(dict(vllm), vllm) == []
    assert disagreements(vllm | {figure: vllm[figure] * 1.14}, vllm) == []
    off = disagreements(vllm | {figure: vllm[figure] * 1.2}, vllm)
    assert len(off) == 1 and off[0].startswith(figure) and "+20%" in off[0]
    missing = disagreements(vllm | {figure: None}, vllm)  # e.g. a TTFT the client never measured
    assert len(missing) == 1 and "not comparable" in missing[0]
