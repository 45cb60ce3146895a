"""benchmarks.investigations.idle_cost's report: medians over rounds per arm, totals, small rows dropped."""

from __future__ import annotations

from benchmarks.harness.cpu_accounting import CLIENT_ROLE
from benchmarks.investigations.idle_cost import HARNESS, table


def test_the_table_reads_the_median_of_the_rounds_and_the_total_of_each_round():
    results: dict[str, list[dict[str, dict[str, float]]]] = {
        "engine": [{"roles": {"vLLM API server": 2.0}}, {"roles": {"vLLM API server": 4.0}}, {"roles": {}}],
        "shipped": [
            {"roles": {"Ray system": 50.0, "replica": 10.0, CLIENT_ROLE: 3.0, "tiny": 0.1}},
            {"roles": {"Ray system": 60.0, "replica": 12.0, CLIENT_ROLE: 3.0, "tiny": 0.1}},
            {"roles": {"Ray system": 40.0, "replica": 11.0, CLIENT_ROLE: 4.0, "tiny": 0.1}},
        ],
    }
    rows = table(results, "roles").splitlines()
    assert rows[0] == "| role | engine | shipped |"
    assert "| Ray system | 0.0 | 50.0 |" in rows  # the median of 50, 60, 40; largest first
    assert rows[2].startswith("| Ray system")
    assert "| replica | 0.0 | 11.0 |" in rows
    assert "| vLLM API server | 2.0 | 0.0 |" in rows  # a round without the row counts as 0
    assert f"| {HARNESS} | 0.0 | 3.0 |" in rows  # the command's own processes named for what they are
    assert not [r for r in rows if r.startswith("| tiny")]  # under 0.5 ms/s in every arm
    assert rows[-1] == "| **all** | **2.0** | **63.1** |"  # the median of the rounds' totals (63.1, 75.1, 55.1)
