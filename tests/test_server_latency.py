"""The server's own TTFT / ITL / TPOT (load_tests.judge.server_latency): read from vLLM's histograms as Ray's agent
exports them, over the run's window, percentiles as PromQL's histogram_quantile reads them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from load_tests.judge.server_latency import percentiles, quantile, server_latency, window_buckets
from load_tests.observe.counters import ReplicaCounters
from load_tests.observe.scraper import replica_counters

BOUNDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def ray_page(replica: str, figure_counts: dict[str, dict[float, float]]) -> str:
    """Histogram lines the way Ray's metrics agent exports a replica's vLLM histograms (labels as seen on Ray
    2.60), with one counter beside them."""
    labels = (
        'Component="core_worker",NodeAddress="127.0.0.1",ReplicaId="{r}",Version="2.60.0",WorkerId="7fa6",'
        'engine="0",le="{le}",model_name="fixture",otel_scope_name="ray._private.telemetry"'
    )
    lines = [f'ray_vllm_generation_tokens_total{{ReplicaId="{replica}",engine="0",model_name="fixture"}} 64.0']
    for name, buckets in figure_counts.items():
        lines.append(f"# HELP ray_vllm_{name} vLLM's histogram")
        lines.append(f"# TYPE ray_vllm_{name} histogram")
        for le, v in buckets.items():
            le_text = "+Inf" if math.isinf(le) else repr(le)
            lines.append(f"ray_vllm_{name}_bucket{{{labels.format(r=replica, le=le_text)}}} {v}")
        lines.append(f'ray_vllm_{name}_count{{ReplicaId="{replica}"}} {max(buckets.values())}')
        lines.append(f'ray_vllm_{name}_sum{{ReplicaId="{replica}"}} 1.0')
    lines.append(f'ray_vllm_request_queue_time_seconds_bucket{{ReplicaId="{replica}",le="0.1"}} 9.0')
    return "\n".join(lines) + "\n"


def cumulative(values, bounds=BOUNDS) -> dict[float, float]:
    arr = np.asarray(values, dtype=float)
    out = {b: float((arr <= b).sum()) for b in bounds}
    out[math.inf] = float(len(arr))
    return out


def test_a_ray_export_is_read_into_each_replicas_histograms():
    page = ray_page(
        "r1",
        {
            "time_to_first_token_seconds": {0.01: 2.0, 0.02: 5.0, math.inf: 6.0},
            "inter_token_latency_seconds": {0.001: 0.0, 0.002: 40.0, math.inf: 40.0},
        },
    )
    page += ray_page("r2", {"request_time_per_output_token_seconds": {0.005: 3.0, math.inf: 4.0}})
    got = replica_counters(page)
    assert got["r1"].histograms == {
        "ttft": {0.01: 2.0, 0.02: 5.0, math.inf: 6.0},
        "itl": {0.001: 0.0, 0.002: 40.0, math.inf: 40.0},
    }
    assert got["r2"].histograms == {"tpot": {0.005: 3.0, math.inf: 4.0}}
    assert got["r1"].generation_tokens == 64.0  # the counters beside them are read as before


def test_a_plain_vllm_export_is_read_too():
    page = (
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0\n'
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0\n'
        'vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0\n'
    )
    assert replica_counters(page)["vllm"].histograms == {"ttft": {0.01: 3.0, math.inf: 4.0}}


def test_quantile_is_linear_inside_its_bucket_as_promql_reads_it():
    buckets = {0.01: 0.0, 0.02: 20.0, 0.05: 40.0, math.inf: 40.0}
    assert quantile(0.25, buckets) == pytest.approx((0.015, 0.01, 0.02))  # rank 10 of the 20 in (10, 20] ms
    assert quantile(0.5, buckets) == pytest.approx((0.02, 0.01, 0.02))
    assert quantile(0.75, buckets) == pytest.approx((0.035, 0.02, 0.05))
    assert quantile(0.5, {}) is None
    assert quantile(0.5, {0.01: 0.0, math.inf: 0.0}) is None


def test_a_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    read = quantile(0.99, {0.01: 5.0, 0.02: 5.0, math.inf: 10.0})
    assert read is not None
    value, lower, upper = read
    assert (value, lower) == (0.02, 0.02) and math.isinf(upper)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(min_value=1e-4, max_value=2.0, allow_nan=False), min_size=1, max_size=300),
    st.sampled_from((0.5, 0.9, 0.95, 0.99)),
)
def test_the_bucket_named_holds_the_observation_at_that_rank(values, q):
    """The percentile's bucket is the one that holds the ceil(q n)-th smallest observation, and the value read lies
    inside it: the figure is never outside the interval it names."""
    read = quantile(q, cumulative(values))
    assert read is not None
    value, lower, upper = read
    kth = sorted(values)[max(math.ceil(q * len(values)) - 1, 0)]
    assert lower < kth <= upper
    assert lower <= value <= (upper if not math.isinf(upper) else lower)


def test_the_window_is_final_minus_baseline_summed_over_replicas():
    before = {"r1": ReplicaCounters("r1", histograms={"itl": {0.01: 100.0, math.inf: 100.0}})}
    after = {
        "r1": ReplicaCounters("r1", histograms={"itl": {0.01: 110.0, math.inf: 130.0}}),
        "r2": ReplicaCounters("r2", histograms={"itl": {0.01: 5.0, math.inf: 5.0}}),  # new since the baseline
    }
    assert window_buckets(after, before, "itl") == {0.01: 15.0, math.inf: 35.0}
    # The negative control: without the baseline the earlier traffic (100 gaps under 10 ms) would set the median.
    read = quantile(0.5, window_buckets(after, {}, "itl"))
    assert read is not None and read[2] == 0.01
    read = quantile(0.6, window_buckets(after, before, "itl"))
    assert read is not None and math.isinf(read[2])


def test_a_replica_id_reused_by_a_new_process_counts_from_zero():
    before = {"r1": ReplicaCounters("r1", histograms={"ttft": {0.01: 50.0, math.inf: 50.0}})}
    after = {"r1": ReplicaCounters("r1", histograms={"ttft": {0.01: 3.0, math.inf: 4.0}})}
    assert window_buckets(after, before, "ttft") == {0.01: 3.0, math.inf: 4.0}


def test_server_latency_names_its_source_counts_and_buckets():
    itl = [0.003] * 80 + [0.03] * 20
    final = {"r1": ReplicaCounters("r1", histograms={"itl": cumulative(itl), "ttft": cumulative([0.015] * 10)})}
    got = server_latency(final, None)
    assert "vllm:inter_token_latency_seconds" in got.source
    assert got.itl.count == 100 and got.ttft.count == 10 and got.tpot.count == 0
    assert got.itl.bucket_s["p50"] == (0.002, 0.005) and got.itl.bucket_s["p99"] == (0.02, 0.05)
    assert got.tpot.p50 is None and got.tpot.bucket_s == {}


def test_percentiles_count_every_observation_inf_included():
    assert percentiles({0.01: 1.0, math.inf: 7.0}).count == 7


def test_the_run_summary_and_its_reports_carry_the_servers_rows():
    """Through summarize (baseline scrape, then the end) to report.md and the console: the server's rows sit under
    the client's, each percentile with its bucket; a withheld client row points at them."""
    import io

    from rich.console import Console

    from load_tests.judge.departures import unexpected_deaths
    from load_tests.judge.summary import summarize
    from load_tests.load.client import RequestResult
    from load_tests.observe.monitor import InvariantChecker, Snapshot
    from load_tests.plan.slo import Slo
    from load_tests.report.console import print_summary
    from load_tests.report.markdown import markdown

    def replica(finished: float, histograms: dict[str, dict[float, float]]) -> ReplicaCounters:
        return ReplicaCounters(
            "r1",
            prompt_tokens=10.0,
            by_source={"local_compute": 10.0},
            requests_finished={"length": finished},
            gauges=True,
            histograms=histograms,
        )

    ok = [
        RequestResult(
            index=i,
            outcome="ok",
            start=0.0,
            e2e=1.0,
            ttft=0.1,
            chunks=5,
            completion_tokens=5,
            spec={"expect": "ok", "stream": True},
        )
        for i in range(3)
    ]
    checker = InvariantChecker(())
    checker.observe(Snapshot(0.0, {"r1": replica(0.0, {"itl": cumulative([0.5] * 1000)})}))  # earlier traffic
    checker.observe(
        Snapshot(
            1.0,
            {
                "r1": replica(
                    3.0, {"itl": cumulative([0.5] * 1000 + [0.003] * 90 + [0.03] * 10), "ttft": cumulative([0.015] * 3)}
                )
            },
        )
    )
    summary = summarize(ok, 3, checker, [], 10.0, Slo(), unexpected_deaths(checker, []), [])
    s = summary.server_latency_s
    assert s is not None and s.itl.count == 100 and s.itl.bucket_s["p50"] == (0.002, 0.005)
    assert s.ttft.count == 3 and s.tpot.count == 0
    md = markdown(summary, "t")
    assert "| itl (server) | | 100 | 4 (2-5) |" in md and "| tpot (server) | | 0 | - |" in md
    out = io.StringIO()
    print_summary(Console(file=out, width=200), summary, __import__("pathlib").Path("r.md"))
    assert "ITL p50 / p99 (server)" in out.getvalue()
    assert type(summary).model_validate_json(summary.model_dump_json()) == summary  # summary.json reads back
