"""vLLM's own OpenAI server with the patches: fuzz over HTTP, bad values get 400."""

from __future__ import annotations

import sys
from typing import Any

import httpx
import pytest

from load_tests.operate.ports import free_port
from serve_app.engine.engine_env import ENGINE_ENV
from testkit.engine_requests import PROMPTS
from testkit.server_process import ServerProcess

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def server(fixture_model, tmp_path_factory):
    port = free_port()
    # Prefix caching and KV offloading on, and a small KV pool, as the load
    # tests will run it: long prefixes get evicted and reloaded.
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(fixture_model),
        "--served-model-name",
        "fixture",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "1024",
        "--enable-prefix-caching",
        "--kv-offloading-size",
        "0.25",
        "--kv-offloading-backend",
        "native",
        "--num-gpu-blocks-override",
        "24",
        "--max-num-seqs",
        "16",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log = tmp_path_factory.mktemp("openai-server") / "server.log"
    srv = ServerProcess(argv, f"http://127.0.0.1:{port}/health", env=ENGINE_ENV, log_path=log)
    yield f"http://127.0.0.1:{port}"
    srv.close()


def complete(base, xargs=None, prompt=PROMPTS[0], **kw):
    body = {"model": "fixture", "prompt": prompt, "max_tokens": 8, "temperature": 0, **kw}
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return httpx.post(f"{base}/v1/completions", json=body, timeout=60)


def test_fuzz_over_http(server):
    plain = complete(server)
    assert plain.status_code == 200, plain.text
    neutral = complete(server, {"fuzz_strength": 0})
    zeroed = complete(server, {"fuzz_strength": 1})
    assert neutral.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    assert zeroed.status_code == 200
    assert zeroed.json()["choices"][0]["text"] != plain.json()["choices"][0]["text"]


@pytest.mark.parametrize(
    "xargs, field",
    [
        ({"fuzz_strength": -1}, "fuzz_strength"),
        ({"fuzz_strength": "high"}, "fuzz_strength"),
        ({"fuzz_strength": 1, "fuzz_mode": "nope"}, "fuzz_mode"),
        ({"fuzz_strength": 1, "fuzz_seed": 0.5}, "fuzz_seed"),
        ({"fuzz_typo": 1}, "fuzz_typo"),
        ({"fuzz_strength": 1, "fuzz_layer": 3}, "fuzz_layer"),  # the fixture model has 2 decoder layers
        ({"fuzz_strength": 1, "fuzz_layer": -4}, "fuzz_layer"),
        ({"fuzz_strength": 1, "fuzz_tokens": "output"}, "fuzz_tokens"),
        ({"fuzz_strength": 1, "fuzz_ramp_tokens": 4}, "fuzz_ramp_tokens"),
    ],
)
def test_bad_fuzz_gets_400_naming_the_field(server, xargs, field):
    r = complete(server, xargs)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"]
    assert complete(server, {"fuzz_strength": 0.5}).status_code == 200


def test_fuzz_at_depth_over_http(server):
    """Through vLLM's own server: the frontend knows the model's layers (the workers' report), serves every depth
    in range, and says the count when a client is out of it."""
    plain = complete(server).json()["choices"][0]["text"]
    for layer in (1, 2, -1, -3):
        r = complete(server, {"fuzz_strength": 3.0, "fuzz_mode": "gaussian", "fuzz_seed": 5, "fuzz_layer": layer})
        assert r.status_code == 200, r.text
        if layer != -3:  # -3 is the embeddings on a 2-layer model
            assert r.json()["choices"][0]["text"] != plain, layer
    r = complete(server, {"fuzz_strength": 1, "fuzz_layer": 7})
    assert r.status_code == 400 and r.json()["error"]["param"] == "vllm_xargs.fuzz_layer"
    assert "between -3 and 2" in r.json()["error"]["message"] and "2 decoder layers" in r.json()["error"]["message"]


def test_chat_with_fuzz(server):
    body: dict[str, Any] = {
        "model": "fixture",
        "messages": [{"role": "user", "content": "count 3 4 5"}],
        "max_tokens": 4,
        "temperature": 0,
        "vllm_xargs": {"fuzz_strength": 2.0, "fuzz_mode": "gaussian", "fuzz_seed": 1},
    }
    r = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    body["vllm_xargs"]["fuzz_strength"] = float("inf")
    r = httpx.post(
        f"{server}/v1/chat/completions",
        content=_json_with_inf(body),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text


def _json_with_inf(body) -> bytes:
    import json

    return json.dumps(body).encode()  # Python writes Infinity, as a careless client would


async def _stream(client, base, prompt, abort_after_chunks):
    body = {"model": "fixture", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True}
    chunks = 0
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
                if abort_after_chunks and chunks >= abort_after_chunks:
                    return "aborted"  # leaving the block closes the connection mid-stream
    return "done" if chunks else "empty"


def test_client_disconnects_mid_stream_keep_the_counters_consistent(server):
    """24 concurrent streams over long shared prefixes, every third dropped after 2 chunks."""
    import asyncio

    from load_tests.observe.invariants import at_rest
    from load_tests.observe.monitor import InvariantChecker, Monitor
    from load_tests.observe.prom_text import parse_samples, series, total
    from load_tests.observe.scraper import fetch
    from testkit.accounting_workload import prompts

    async def run():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                *(_stream(client, server, p, 2 if i % 3 == 0 else 0) for i, p in enumerate(prompts(24)))
            )

    results = asyncio.run(run())
    assert results.count("aborted") == 8 and results.count("done") == 16

    # The aborts reach the engine asynchronously: wait for quiescence as the load tests do.
    asyncio.run(Monitor([f"{server}/metrics"], InvariantChecker(), settle_interval=0.5).quiescent_check(60))
    samples = parse_samples(httpx.get(f"{server}/metrics", timeout=10).text)
    assert total(samples, "vllm:num_requests_running") == 0
    [server_counters] = fetch([f"{server}/metrics"]).replicas.values()
    assert server_counters.prompt_tokens > 0 and at_rest(server_counters) == [], "the load test's own rules hold"
    by_source = server_counters.by_source
    assert by_source.get("external_kv_transfer", 0) > 0 or by_source.get("local_cache_hit", 0) > 0
    violations = list(series(samples, "vllm:prompt_token_accounting_violations_total"))
    assert violations, "the accounting patch exports its violation counter"
    assert all(v == 0 for _, v in violations), violations
    assert complete(server, {"fuzz_strength": 0.5}).status_code == 200, "the server keeps serving"
