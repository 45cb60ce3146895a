"""The request timeline (benchmarks.investigations.request_timeline) on planted records, and the HTTP edge hooks
(benchmarks.investigations.handoff_hooks) on Starlette's real app class."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from benchmarks.investigations import request_timeline as rt
from benchmarks.investigations.handoff_hooks import body_prompt, prompt_digest


def _planted(t0: float, xrid: str, rid: str, prompt: str, ray: bool = True) -> tuple[list[dict], dict]:
    """One request's server records: Ray's edge at t0 + 2 ms, the app at + 3, arrival + 5, sent + 6, first token
    got + 20, done + 21, the app's first body + 23, Ray's + 24 (seconds on the client's clock)."""
    ms = 0.001
    app = {"edge": "app", "xrid": xrid, "path": "/v1/completions", "in": t0 + 3 * ms, "first": t0 + 23 * ms}
    app |= {"rids": [rid], "prompt": prompt_digest(prompt)}
    edges = [app]
    if ray:
        edges.append({"edge": "ray", "xrid": xrid, "path": "/v1/completions", "in": t0 + 2 * ms, "first": t0 + 24 * ms})
    first = {"rid": rid, "arrival": t0 + 5 * ms, "sent": t0 + 6 * ms, "got": t0 + 20 * ms, "done": t0 + 21 * ms}
    return edges, first


def _trace(tmp_path, starts, ray=True, extra=(), order=None):
    """A trace of requests starting at ``starts`` with PROMPTS, written in ``order`` (the server's, not the
    client's)."""
    lines = [*extra]
    for i in order or range(len(starts)):
        edges, first = _planted(starts[i], f"x{i}", f"r{i}", PROMPTS[i], ray)
        lines += [*edges, first]
    lines.append({"step": 1.0, "outputs": 1, "first": 0})
    path = tmp_path / "t.trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return rt.read_records(path)


# two requests start together (a bunch), a third 100 ms later; each reads its first token 26 ms after its start
STARTS = [10.0, 10.001, 10.1]
PROMPTS = ["a b c", "d e f", "g h i"]
CLIENT = {"start_times": STARTS, "ttfts": [0.026] * 3, "latencies": [0.2] * 3}


def test_each_stage_is_read_between_the_right_timestamps(tmp_path):
    edges, firsts = _trace(tmp_path, STARTS)
    rows = rt.join(CLIENT, PROMPTS, edges, firsts)
    assert rows[0] == pytest.approx(
        {
            "to_server": 2.0,
            "ray_to_app": 1.0,
            "app_to_arrival": 2.0,
            "front_in": 1.0,
            "engine": 14.0,
            "output": 1.0,
            "to_app_send": 2.0,
            "app_to_wire": 1.0,
            "to_client": 2.0,
        }
    )
    summary = rt.summarize(CLIENT, rows, 0.005)
    assert summary["first"]["requests"] == 2 and summary["all"]["requests"] == 3  # the bunch's first, and the third
    assert summary["all"]["ttft"] == pytest.approx(26.0)


def test_bunches_follow_start_order_not_file_order():
    # requests starting within the gap of the previous start (in time order) form one bunch; 8 started within 1 ms
    # are one bunch of 8, the same 8 spread 25 ms apart are 8 bunches of 1
    assert rt.bunches([0.3, 0.0, 0.301, 0.001, 1.0], gap_s=0.005) == [[1, 3], [0, 2], [4]]
    assert rt.bunches([i * 0.0001 for i in range(8)], gap_s=0.005) == [list(range(8))]
    assert rt.bunches([i * 0.025 for i in range(8)], gap_s=0.005) == [[i] for i in range(8)]


def test_without_ray_the_app_is_the_outer_edge_and_the_ray_stages_are_zero(tmp_path):
    edges, firsts = _trace(tmp_path, STARTS, ray=False)
    row = rt.join(CLIENT, PROMPTS, edges, firsts)[2]
    assert row["ray_to_app"] == 0.0 and row["app_to_wire"] == 0.0
    assert row["to_server"] == pytest.approx(3.0) and row["to_client"] == pytest.approx(3.0)


def test_requests_are_joined_by_prompt_whatever_order_the_server_saw_them_in(tmp_path):
    # the server saw the bunch's second request first, and recorded a warm-up request and a probe besides
    warm, _ = _planted(-50.0, "w", "rw", "warm-up prompt")
    probe = {"edge": "ray", "xrid": "h", "path": "/health", "in": 10.05, "first": 10.051, "rids": []}
    edges, firsts = _trace(tmp_path, [10.001, 10.0, 10.1], extra=[*warm, probe], order=[1, 0, 2])
    rows = rt.join(CLIENT, [PROMPTS[1], PROMPTS[0], PROMPTS[2]], edges, firsts)
    assert [r["to_server"] for r in rows] == pytest.approx([2.0, 2.0, 2.0])


def test_a_join_that_does_not_fit_is_refused(tmp_path):
    edges, firsts = _trace(tmp_path, STARTS)
    # negative controls: a prompt the server never saw; a first token the client read before the server sent it;
    # a client file without per-request times; a prompt file of another length
    with pytest.raises(rt.JoinError, match="request 1: no app record"):
        rt.join(CLIENT, [PROMPTS[0], "never sent", PROMPTS[2]], edges, firsts)
    with pytest.raises(rt.JoinError, match="outside the client's"):
        rt.join({**CLIENT, "ttfts": [0.020] * 3}, PROMPTS, edges, firsts)
    with pytest.raises(rt.JoinError, match="start_times"):
        rt.join({"ttfts": [0.1]}, PROMPTS, edges, firsts)
    with pytest.raises(rt.JoinError, match="prompt file holds 2"):
        rt.join(CLIENT, PROMPTS[:2], edges, firsts)
    ray_lost = {"app": edges["app"], "ray": edges["ray"][:1]}  # Ray's record of two requests missing
    with pytest.raises(rt.JoinError, match="no record of Ray's edge"):
        rt.join(CLIENT, PROMPTS, ray_lost, firsts)


def test_the_prompt_is_read_from_a_completions_or_a_chat_body():
    assert body_prompt(b'{"prompt": "a b c"}') == prompt_digest("a b c")
    chat = {"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "a b c"}]}
    assert body_prompt(json.dumps(chat).encode()) == prompt_digest("a b c")
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b"}, {"type": "text", "text": " c"}]}]
    }
    assert body_prompt(json.dumps(parts).encode()) == prompt_digest("a b c")
    assert body_prompt(b"not json") is None and body_prompt(b'{"prompt": [1, 2]}') is None


def test_the_edge_hooks_record_the_outermost_app_once_with_the_frontend_requests_it_added(tmp_path, handoff_originals):
    """Starlette's real app class wrapped by install_edges(): one record per HTTP request, for the outer app only
    (a mounted app inside it is the same request), with the rid that add_request_async saw in its context and the
    time its first body bytes left; a lifespan scope is not recorded. A Ray-style entry wrapped by traced_asgi
    records its own edge."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Mount, Route

    from benchmarks.investigations import handoff_hooks as hh

    writer = hh.TraceWriter(tmp_path / "trace.jsonl")
    hh.install_edges(writer, 7)
    hh.install_edges(writer, 7)  # idempotent
    assert getattr(Starlette.__call__, "_handoff_traced", False)

    async def endpoint(request):
        edge = hh._EDGE.get()
        assert edge is not None
        edge["rids"].append("r1")  # what traced_add does with the request it hands to EngineCore
        await request.body()

        async def body():
            yield b"data: 1\n\n"
            yield b"data: 2\n\n"

        return StreamingResponse(body())

    inner = Starlette(routes=[Route("/completions", endpoint, methods=["POST"])])
    app = Starlette(routes=[Mount("/v1", app=inner)])
    sent: list[dict] = []

    bodies = [{"type": "http.request", "body": b'{"prompt": "a b c"}', "more_body": False}]

    async def receive():  # the body once, then nothing until the response ends (a client that stays connected)
        if bodies:
            return bodies.pop()
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    async def ray_entry(self, scope, receive, send):
        await app(scope, receive, send)

    ray = hh.traced_asgi(ray_entry, writer, "ray", 7)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"x-request-id", b"abc")],
        "scheme": "http",
        "server": ("127.0.0.1", 8000),
    }
    t = time.monotonic()
    asyncio.run(ray(None, scope, receive, send))
    lifespan = [{"type": "lifespan.shutdown"}, {"type": "lifespan.startup"}]

    async def lifespan_receive():
        return lifespan.pop()

    asyncio.run(ray(None, {"type": "lifespan"}, lifespan_receive, send))  # not HTTP: passes through unrecorded
    records = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [r["edge"] for r in records] == ["app", "ray"], "one app record (not the mounted app's), then Ray's"
    app_rec, ray_rec = records
    assert app_rec["xrid"] == ray_rec["xrid"] == "abc" and app_rec["rids"] == ["r1"] and ray_rec["rids"] == []
    assert t <= ray_rec["in"] <= app_rec["in"] <= app_rec["first"] <= ray_rec["first"] <= ray_rec["end"]
    assert app_rec["in"] <= app_rec["started"] <= app_rec["first"], "the response's start, before its first body"
    assert app_rec["pid"] == 7 and app_rec["path"] == "/v1/completions"
    assert app_rec["prompt"] == prompt_digest("a b c") and "prompt" not in ray_rec
    assert next(m["body"] for m in sent if m["type"] == "http.response.body" and m.get("body")) == b"data: 1\n\n"


def test_handoff_split_reads_each_runs_timeline_and_names_a_run_that_does_not_join(tmp_path):
    from benchmarks.investigations import handoff_split as hs

    edges, firsts = _trace(tmp_path, STARTS)
    (tmp_path / "c.json").write_text(json.dumps(CLIENT))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (tmp_path / "other.jsonl").write_text("".join(json.dumps({"prompt": p + "!"}) + "\n" for p in PROMPTS))
    good = hs.run_timeline(tmp_path / "c.json", tmp_path / "p.jsonl", edges, firsts)
    bad = hs.run_timeline(tmp_path / "c.json", tmp_path / "other.jsonl", edges, firsts)
    assert good["all"]["to_server"] == pytest.approx(2.0) and "no app record" in bad["error"]
    results = [
        {"arm": "shipped", "pair": p, "label": "c8", "void": None, "timeline": t}
        for p, t in ((0, good), (1, good), (2, bad))
    ]
    text = "\n".join(hs.timeline_markdown(results))
    assert "| c8 | shipped (first) | 4 | 2.0 | 1.0 |" in text  # two runs' bunch-first requests, 2 each
    assert "pair 2 shipped c8: request 0: no app record" in text


def test_front_in_splits_into_the_renderers_marks_where_the_trace_has_them(tmp_path):
    edges, firsts = _trace(tmp_path, STARTS)
    app = edges["app"][0]  # request 0: arrival + 5 ms, sent + 6 ms
    app |= {"tok_in": STARTS[0] + 0.0052, "tok_out": STARTS[0] + 0.0055, "rendered": STARTS[0] + 0.0057}
    row = rt.join(CLIENT, PROMPTS, edges, firsts)[0]
    parts = [row[k] for k in rt.FRONT_PARTS]
    assert parts == pytest.approx([0.2, 0.3, 0.2, 0.3]) and sum(parts) == pytest.approx(row["front_in"])
    summary = rt.summarize(CLIENT, rt.join(CLIENT, PROMPTS, edges, firsts), 0.005)
    assert "tokenize" not in summary["all"], "requests 1 and 2 have no marks: no mean over some of them"
    assert "front_in: tokenize" not in rt.markdown([("c.json", summary)])
    assert not any(k in row for k in rt.TO_ENGINE_PARTS), "no response start or add_request marked"
    app |= {"started": STARTS[0] + 0.0058, "gen": STARTS[0] + 0.0059}
    row = rt.join(CLIENT, PROMPTS, edges, firsts)[0]
    way = [row[k] for k in rt.TO_ENGINE_PARTS]
    assert way == pytest.approx([0.1, 0.1, 0.1]) and sum(way) == pytest.approx(row["to_engine"])
    app |= {"started": STARTS[0] + 0.0059, "gen": STARTS[0] + 0.0058}  # early_submit: asked before the start
    row = rt.join(CLIENT, PROMPTS, edges, firsts)[0]
    way = [row[k] for k in rt.TO_ENGINE_PARTS]
    assert way == pytest.approx([0.1, 0.0, 0.2]) and sum(way) == pytest.approx(row["to_engine"])


def test_a_stage_is_marked_only_inside_a_request_and_only_at_its_first_call():
    from benchmarks.investigations import handoff_hooks as hh

    async def tokenize():
        await asyncio.sleep(0.01)
        return [1, 2]

    marked = hh.timed_stage(tokenize, "tok_in", "tok_out")

    async def request():
        record: dict[str, object] = {"rids": []}
        token = hh._EDGE.set(record)
        try:
            assert await marked() == [1, 2]
            first = dict(record)
            await marked()
        finally:
            hh._EDGE.reset(token)
        return first, record

    first, record = asyncio.run(request())
    assert first["tok_out"] - first["tok_in"] >= 0.009 and record == first, "the second call changes nothing"
    assert asyncio.run(marked()) == [1, 2]  # outside a request: nothing to mark, the result unchanged
