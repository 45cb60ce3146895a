"""README's headline table is the table its run's results give (benchmarks/headline.py).

The first link to a ``vs_vllm.md`` in README's "How fast" is the headline's
run; its ``vs_vllm.json`` beside it, put through the generator, must give
README's table line for line. The generator is held to a table written by
hand before it existed (README's at the time it was written), and must show
a changed verdict or a missing arm.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _how_fast() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## How fast")
    return text[start : text.index("\n## ", start + 1)]


def _headline_results() -> dict:
    m = re.search(r"\]\((docs/benchmarks/[^)]+)/vs_vllm\.md\)", _how_fast())
    assert m, "README's 'How fast' links no vs_vllm.md"
    return json.loads((REPO / m.group(1) / "vs_vllm.json").read_text())


def test_readmes_headline_table_is_the_one_its_runs_results_give():
    from benchmarks.headline import table

    generated = table(_headline_results()).splitlines()
    section = _how_fast().splitlines()
    missing = [line for line in generated if line not in section]
    assert not missing, "README's headline table differs from its run's results:\n" + "\n".join(missing)


HAND_WRITTEN_4ARMS = """\
| 1 in flight | 1.30x [1.05, 1.36] met | 0.59x [0.56, 0.74] met | 1.05x [0.96, 1.33] **not met** | 0.89x [0.75, 0.96] met | 4.5 / 4.9 / 6.2 / 5.9 | 1.99 / 1.99 / 1.30 / 1.50 |
| 8 | 1.12x [0.99, 1.29] met | 0.77x [0.67, 0.86] met | 1.66x [1.52, 1.82] **not met** | 1.07x [0.85, 1.27] **not met** | 24.2 / 17.0 / 29.4 / 28.1 | 1.99 / 1.99 / 1.55 / 1.72 |
| chat, 32 | 0.94x [0.88, 1.14] **not met** | 0.96x [0.81, 1.02] met | 1.47x [1.27, 1.55] **not met** | 0.90x [0.69, 1.05] **not met** | 43.6 / 30.3 / 45.9 / 42.4 | 1.98 / 1.99 / 1.62 / 1.79 |"""  # noqa: E501 (README's rows for the 2026-11-29 20:33 run, written by hand before the generator)


def test_the_generator_gives_the_table_written_by_hand_and_shows_a_changed_verdict_or_missing_arm():
    from benchmarks.headline import summary, table

    results = json.loads((REPO / "docs/benchmarks/vs_vllm_4arms/vs_vllm.json").read_text())
    lines = table(results).splitlines()
    assert len(lines) == 2 + 6  # header, rule, one row per run label
    for row in HAND_WRITTEN_4ARMS.splitlines():
        assert row in lines
    assert summary(results).startswith("host AMD EPYC, x86_64, 2 CPUs, 24 GiB, Python 3.11.7; started 2026-11-29")
    assert "0 void runs of 144, 0 failed requests in all runs, 0 cache-hit tokens" in summary(results)
    # a void run's failed requests are counted though the run is not (the counted runs never have any)
    retried = copy.deepcopy(results)
    failing = copy.deepcopy(retried["runs"][0])
    failing.update(failed=3, void="3 failed request(s)", attempt=failing.get("attempt", 0) + 1)
    retried["runs"].insert(0, failing)
    assert "1 void runs of 145, 3 failed requests in all runs" in summary(retried)

    changed = copy.deepcopy(results)
    for g in changed["goals"]:
        if (g["run"], g["goal"]) == ("c1", "TTFT p50 shipped / plain <= 1.1x"):
            g["verdict"] = "met"
    del changed["arms"]["c8"]["stock"]
    rows = table(changed).splitlines()
    assert "| 1 in flight | 1.30x [1.05, 1.36] met | 0.59x [0.56, 0.74] met | 1.05x [0.96, 1.33] met |" in rows[2]
    assert "| 24.2 / - / 29.4 / 28.1 |" in rows[3]
    assert rows[2] not in lines and rows[3] not in lines
