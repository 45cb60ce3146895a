r"""One request's way to its first token, stage by stage, from the client's clock to the client's clock.

    python -m benchmarks.investigations.request_timeline TRACE.jsonl CLIENT.json PROMPTS.jsonl

Why: at 8 in flight even a bunch's *first* request (:func:`bunches`; docs/results_log.md, the arrival_bunches entries)
waits 49 ms for its first token through the shipped stack against 31 ms through our engine behind vLLM's
own server, with or without HAProxy's hop: the difference lies in the replica's process, and the hand-off
split (:mod:`benchmarks.investigations.handoff_split`) sees only vLLM's part of it. This joins, per
request, the client's start and first token (``vllm bench serve --save-detailed``: ``start_times``,
``ttfts``, on ``time.perf_counter``, the host's CLOCK_MONOTONIC) with the server's timestamps that
:mod:`benchmarks.investigations.handoff_hooks` writes on the same clock, and splits the client's TTFT into
stages that add up to it:

==================  ===========================================================================
``to_server``       the client's start until the server's outermost edge has the request: the
                    client, HAProxy (Serve arms), the HTTP server's read and parse
``ray_to_app``      Ray's direct-ingress entry (the replica's main loop) until vLLM's app is
                    entered (the thread that runs user code); 0 without Ray
``app_to_arrival``  vLLM's app until vLLM's arrival: middlewares (the guard), routing, the body
``front_in``        vLLM's arrival until the frontend hands the request to EngineCore
``engine``          that hand-off until the frontend's output loop has the first token
``output``          the frontend's processing of that step's outputs
``to_app_send``     those outputs until the app sends the first body bytes (the stream generator,
                    the response's middlewares)
``app_to_wire``     the app's send until Ray's HTTP server hands them to the socket (the hop back
                    to the main loop); 0 without Ray
``to_client``       the socket until the client reads its first token: HAProxy, the client
==================  ===========================================================================

Where the trace marks vLLM's renderer, ``front_in`` splits further (:data:`FRONT_PARTS`): the render until it
asks for tokens, tokenizing (handed to the renderer's thread pool, and the turn back to the loop), the rest of
the render, and from the render's end until the frontend hands the request to EngineCore (vLLM's handler, the
streaming response, the engine's input processing); where it also marks the response's start and vLLM's
``AsyncLLM.add_request``, that last part splits again (:data:`TO_ENGINE_PARTS`): until the app sends the
response's start (or, where the ``early_submit`` patch asks the engine first, until it asks), until the streamed
body's first read asks the engine client to add the request (0 where it asked first), and until the request is
sent.

Requests are joined to the server's records by their prompts (every prompt of a run is unique; the
client sends them in the order of its prompt file, ``--prompts``, and reports them in that order; the
app's edge records a digest of the prompt it received): never by order, which the server's event loops
do not keep within a bunch. A join that does not fit (a request the server did not record, or a stage
outside the client's times) is refused, never guessed. Printed
per client file: each stage's mean for the bunches' first requests and for all requests (the means add
up to the mean TTFT). A reading aid: it asserts no target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.investigations.handoff_hooks import load_trace, prompt_digest
from load_tests.command_logs import command_logging

STAGES = (
    "to_server",
    "ray_to_app",
    "app_to_arrival",
    "front_in",
    "engine",
    "output",
    "to_app_send",
    "app_to_wire",
    "to_client",
)
# front_in's parts, where the trace marks vLLM's renderer (they add up to front_in): the render until it asks for
# tokens, tokenizing (the renderer's thread pool and the turn back), the render's end, then until EngineCore has it
FRONT_PARTS = ("render_pre", "tokenize", "render_post", "to_engine")
# to_engine's parts, where the trace also marks the response's start and the engine client's add_request (they add
# up to to_engine): the handler's return until the app sends the response's start (FastAPI, Starlette's streaming
# response), until the streamed body's first read asks vLLM's engine client to add the request, then until it is sent
TO_ENGINE_PARTS = ("to_response", "to_generate", "to_send")
PATHS = ("/v1/completions", "/v1/chat/completions")
# A closed loop's requests start in bunches (those prefilled in one step end together and start their successors
# together): starts closer than this to the previous one are one bunch (a fraction of a decode step here). Moved here
# from the retired arrival_bunches (docs/results_log.md, the arrival_bunches entries).
GAP_MS = 5.0


def bunches(start_times: list[float], gap_s: float) -> list[list[int]]:
    """Request indices grouped into bunches: consecutive starts (in time order) within ``gap_s`` of each other."""
    order = sorted(range(len(start_times)), key=start_times.__getitem__)
    groups: list[list[int]] = []
    for prev, cur in zip([None, *order], order, strict=False):
        if prev is None or start_times[cur] - start_times[prev] > gap_s:
            groups.append([cur])
        else:
            groups[-1].append(cur)
    return groups


class JoinError(ValueError):
    """The client's requests and the server's records do not line up."""


def index_records(records: list[dict[str, Any]]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """A trace's edge records by edge (``ray``, ``app``; completions and chat only) and first-token records by
    rid."""
    edges: dict[str, list[dict[str, Any]]] = {"ray": [], "app": []}
    firsts: dict[str, dict[str, Any]] = {}
    for record in records:
        if "edge" in record:
            if record.get("path") in PATHS:
                edges[record["edge"]].append(record)
        elif "rid" in record:
            firsts[record["rid"]] = record
    return edges, firsts


def read_records(path: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """:func:`index_records` of a trace file."""
    return index_records(load_trace(path))


def stages(
    start: float,
    ttft: float,
    ray: dict[str, Any] | None,
    app: dict[str, Any],
    first: dict[str, Any],
) -> dict[str, float]:
    """One request's stages in ms (:data:`STAGES`); ``ray`` None where no Ray replica served it."""
    outer_in, outer_first = (ray["in"], ray["first"]) if ray else (app["in"], app["first"])
    s = {
        "to_server": outer_in - start,
        "ray_to_app": app["in"] - ray["in"] if ray else 0.0,
        "app_to_arrival": first["arrival"] - app["in"],
        "front_in": first["sent"] - first["arrival"],
        "engine": first["got"] - first["sent"],
        "output": first["done"] - first["got"],
        "to_app_send": app["first"] - first["done"],
        "app_to_wire": ray["first"] - app["first"] if ray else 0.0,
        "to_client": start + ttft - outer_first,
    }
    if all(app.get(k) is not None for k in ("tok_in", "tok_out", "rendered")):
        s |= {
            "render_pre": app["tok_in"] - first["arrival"],
            "tokenize": app["tok_out"] - app["tok_in"],
            "render_post": app["rendered"] - app["tok_out"],
            "to_engine": first["sent"] - app["rendered"],
        }
        if app.get("started") is not None and app.get("gen") is not None:
            asked = min(app["started"], app["gen"])  # the early_submit patch asks before the response starts
            s |= {
                "to_response": asked - app["rendered"],
                "to_generate": app["gen"] - asked,
                "to_send": first["sent"] - app["gen"],
            }
    return {k: 1000 * v for k, v in s.items()}


def join(
    client: dict[str, Any],
    prompts: list[str],
    edges: dict[str, list[dict[str, Any]]],
    firsts: dict[str, dict[str, Any]],
) -> list[dict[str, float]]:
    """Per client request (in the client file's order, which is ``prompts``' order): its stages (ms). Raises
    :class:`JoinError`."""
    starts, ttfts = client.get("start_times"), client.get("ttfts")
    if not starts or not ttfts or len(starts) != len(ttfts):
        raise JoinError("the client file has no per-request start_times and ttfts (--save-detailed)")
    if len(prompts) != len(starts):
        raise JoinError(f"the client sent {len(starts)} requests, its prompt file holds {len(prompts)}")
    apps = {e["prompt"]: e for e in edges["app"] if e.get("prompt")}
    rays = {e["xrid"]: e for e in edges["ray"] if e.get("xrid")}
    out: list[dict[str, float]] = []
    for i, prompt in enumerate(prompts):
        app = apps.get(prompt_digest(prompt))
        if app is None or not app["rids"] or app["rids"][0] not in firsts or app["first"] is None:
            raise JoinError(f"request {i}: no app record with its prompt, or no first token, in the trace")
        ray = rays.get(app["xrid"]) if edges["ray"] else None
        if edges["ray"] and (ray is None or ray["first"] is None):
            raise JoinError(f"request {i} ({app['xrid']}): no record of Ray's edge, or it sent no body")
        row = stages(starts[i], ttfts[i], ray, app, firsts[app["rids"][0]])
        if row["to_server"] < 0 or row["to_client"] < 0:
            raise JoinError(f"request {i}: the server's times fall outside the client's ({row})")
        out.append(row)
    return out


def read_prompts(path: Path) -> list[str]:
    """A prompt file in vLLM's ``custom`` dataset format (what the benchmark wrote for the run)."""
    return [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines() if line.strip()]


def summarize(client: dict[str, Any], rows: list[dict[str, float]], gap_s: float) -> dict[str, Any]:
    """Each stage's mean for the bunches' first requests (``first``) and for all (``all``), with the mean TTFT
    (the stages' sum: they run from the client's start to its first token)."""
    firsts = [g[0] for g in bunches(client["start_times"], gap_s)]
    out: dict[str, Any] = {}
    for name, idx in (("first", firsts), ("all", list(range(len(rows))))):
        keys = [*STAGES, *(k for k in (*FRONT_PARTS, *TO_ENGINE_PARTS) if all(k in rows[i] for i in idx))]
        mean = {k: statistics.fmean(rows[i][k] for i in idx) for k in keys}
        ttft = statistics.fmean(1000 * client["ttfts"][i] for i in idx)
        out[name] = {**mean, "requests": len(idx), "ttft": ttft}
    return out


def markdown(rows: list[tuple[str, dict[str, Any]]], gap_ms: float = GAP_MS) -> str:
    parts = [k for k in (*FRONT_PARTS, *TO_ENGINE_PARTS) if all(k in summary["all"] for _, summary in rows)]
    head = ["file", "requests", *STAGES, "TTFT (mean)", *(f"front_in: {k}" for k in parts)]
    lines = [
        f"Mean ms per request; `first`: the bunches' first requests (starts within {gap_ms:g} ms form a bunch)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name, summary in rows:
        for which in ("first", "all"):
            s = summary[which]
            cells = [f"{name} ({which})", str(s["requests"]), *(f"{s[k]:.1f}" for k in STAGES)]
            lines.append("| " + " | ".join([*cells, f"{s['ttft']:.1f}", *(f"{s[k]:.1f}" for k in parts)]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.investigations.request_timeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("trace", type=Path, help="a trace handoff_split wrote (its work directory, *.trace.jsonl)")
    ap.add_argument("client", type=Path, help="the client result file of one of that trace's runs")
    ap.add_argument("prompts", type=Path, help="the prompt file of that run (the work directory's prompts/)")
    ap.add_argument("--gap-ms", type=float, default=GAP_MS, help="starts closer than this are one bunch")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    command_logging()
    edges, firsts = read_records(args.trace)
    client = json.loads(args.client.read_text())
    summary = summarize(client, join(client, read_prompts(args.prompts), edges, firsts), args.gap_ms / 1000)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    print(markdown([(args.client.name, summary)], args.gap_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
