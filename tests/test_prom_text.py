"""Prometheus text parsing helpers (pure)."""

from load_tests.observe.prom_text import parse_samples, series, total

TEXT = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 30.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 12.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="local_compute"} 8.0
# HELP vllm:prompt_tokens_total Prompt tokens.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 42.0
"""


def test_total_and_series():
    s = parse_samples(TEXT)
    assert total(s, "vllm:prompt_tokens_total") == 42
    assert total(s, "vllm:prompt_tokens_by_source_total") == 50
    assert total(s, "vllm:prompt_tokens_by_source_total", engine="0") == 42
    assert total(s, "vllm:prompt_tokens_by_source_total", source="local_compute") == 38
    assert total(s, "vllm:nothing_total") == 0
    assert sorted(v for _, v in series(s, "vllm:prompt_tokens_by_source_total")) == [8, 12, 30]
