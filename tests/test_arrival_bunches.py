"""benchmarks/investigations/arrival_bunches.py: bunches of a closed loop's starts, read from vLLM client results."""

from __future__ import annotations

import json

import pytest

from benchmarks.investigations.arrival_bunches import bunches, main, read


def _result(tmp_path, starts, ttfts, name="r.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"start_times": starts, "ttfts": ttfts}))
    return path


def test_requests_started_together_read_as_one_bunch_and_spread_ones_as_single(tmp_path):
    # 5 cycles of 8 requests that start within 1 ms of each other, 200 ms apart: every request in a bunch of 8
    together = [c * 0.2 + i * 0.0001 for c in range(5) for i in range(8)]
    ttfts = [0.010 + 0.005 * i for _ in range(5) for i in range(8)]  # the later in its bunch, the later its first token
    got = read(_result(tmp_path, together, ttfts), gap_s=0.005)
    assert (got.requests, got.mean_bunch, got.share_in_large) == (40, 8.0, 1.0)
    assert got.ttft_ms_by_rank == {i: pytest.approx(10 + 5 * i) for i in range(8)}
    # the same 40 requests 25 ms apart: no bunch
    spread = read(_result(tmp_path, [i * 0.025 for i in range(40)], ttfts, "s.json"), gap_s=0.005)
    assert (spread.mean_bunch, spread.share_in_large) == (1.0, 0.0)
    assert list(spread.ttft_ms_by_rank) == [0]


def test_bunches_follow_start_order_not_file_order():
    assert bunches([0.3, 0.0, 0.301, 0.001, 1.0], gap_s=0.005) == [[1, 3], [0, 2], [4]]


def test_a_result_without_per_request_times_is_refused(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"median_ttft_ms": 50.0}))
    with pytest.raises(ValueError, match="save-detailed"):
        read(path, gap_s=0.005)


def test_the_command_prints_a_row_per_file(tmp_path, capsys):
    a = _result(tmp_path, [0.0, 0.001, 0.5], [0.01, 0.02, 0.01], "a.json")
    assert main([str(a), "--json", str(tmp_path / "out.json")]) == 0
    assert "| a.json | 3 | 1.67 | 0.00 |" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())[0]["requests"] == 3
