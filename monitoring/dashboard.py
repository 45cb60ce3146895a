"""The Grafana dashboard, written as data: ``python -m monitoring.dashboard`` regenerates the JSON file.

    python -m monitoring.dashboard            # writes monitoring/grafana/fuzzserve-dashboard.json
    python -m monitoring.dashboard --check    # exit 1 if the committed file is not what this module makes

Why a generator: a dashboard JSON is mostly boilerplate (grid positions,
data-source references, legend options) around a dozen PromQL expressions;
the expressions and the layout are what a reader should review, here. The
output is checked against Grafana's schema (:mod:`testkit.monitoring.grafana_schema`)
and every expression is run through promtool against a real deployment's
series (tests/test_monitoring_dashboard.py).

Metric and recording-rule names come from the observability contract (:mod:`serve_app.observability.contract`),
which the Prometheus rules are written from too (:mod:`monitoring.rules`).

Queries use two Grafana variables: ``$replica`` (Ray's ``ReplicaId``, multi-
select, all by default) and Grafana's ``$__rate_interval``; the data source is
chosen with ``$datasource``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from serve_app.observability.contract import (
    BY_SOURCE,
    CORRECTIONS,
    DEPLOYMENT_ERRORS,
    DEPLOYMENT_REQUESTS,
    FUZZED_SHARE,
    GENERATION_TOKENS,
    HEALTH_GAUGE,
    PROMPT,
    SUCCESS,
    UNACCOUNTED,
    VIOLATIONS,
    exported,
)
from serve_app.observability.contract import SOURCES as PROMPT_SOURCES
from serve_app.observability.fuzz_traffic import EXPORTED as ADMITTED

from .files import DASHBOARD_FILE

DS = {"type": "prometheus", "uid": "${datasource}"}
R = 'ReplicaId=~"$replica"'
SOURCES = f'source=~"{"|".join(PROMPT_SOURCES)}"'
UID = "fuzzserve-invariants"
# Ray cannot export a counter at 0: a deployment without errors has no error series, hence the `or 0 *`.
ERRORS = f"sum by (deployment) (rate({DEPLOYMENT_ERRORS}[$__rate_interval]))"
REQUESTS = f"sum by (deployment) (rate({DEPLOYMENT_REQUESTS}[$__rate_interval]))"


def q(expr: str, legend: str, ref: str = "A") -> dict[str, Any]:
    return {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}


def quantiles(metric: str) -> list[dict[str, Any]]:
    return [
        q(
            f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{R}}}[$__rate_interval])))",
            f"p{round(p * 100)}",
            ref,
        )
        for p, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))
    ]


# (title, description, unit, stacked, queries): one time-series panel each, two per row of the grid.
SECTIONS: list[tuple[str, list[tuple[str, str, str, bool, list[dict[str, Any]]]]]] = [
    (
        "Invariants (alerts: monitoring/prometheus/fuzzserve-rules.yml)",
        [
            (
                "Prompt tokens in no source (0 = invariant holds)",
                (
                    "prompt_tokens minus local_compute + local_cache_hit + external_kv_transfer, per replica. Lags by "
                    "one export while requests are admitted; must be 0 at rest (alert FuzzservePromptTokensDoNotSum)."
                ),
                "short",
                False,
                [q(f"{UNACCOUNTED}{{{R}}}", "{{ReplicaId}}")],
            ),
            (
                "Replicas: exporting vLLM series vs healthy in Serve",
                (
                    "Ray keeps exporting a dead replica's series (Ray issue 65892): more exporting than healthy means "
                    "stale series are in every sum (alert FuzzserveReplicaSeriesStale)."
                ),
                "short",
                False,
                [
                    q(f"count(max by (ReplicaId) ({PROMPT}))", "exporting vLLM series"),
                    q(f"sum by (deployment) ({HEALTH_GAUGE})", "healthy in Serve: {{deployment}}", "B"),
                ],
            ),
            (
                "Share of requests raising errors, per Serve deployment",
                (
                    "Errors / (errors + requests) of each deployment. Stock vLLM's accounting bug shows here: "
                    "EngineCore dies on a bad connector report and every later request fails (alert "
                    "FuzzserveDeploymentRequestsFailing)."
                ),
                "percentunit",
                False,
                [q(f"({ERRORS} or 0 * {REQUESTS}) / (({ERRORS} or 0 * {REQUESTS}) + {REQUESTS})", "{{deployment}}")],
            ),
            (
                "Accounting violations (cumulative, by kind)",
                (
                    "The accounting patch's clamps over each replica's life. connector_* and "
                    "prefill_stats_inconsistent: a KV connector reported impossible matches (warning); any other kind: "
                    "critical."
                ),
                "short",
                False,
                [
                    q(
                        f"sum by (ReplicaId, kind) ({VIOLATIONS}{{{R}}})",
                        "{{ReplicaId}} {{kind}}",
                    )
                ],
            ),
            (
                "Accounting corrections per finished request (by kind)",
                (
                    "Stats corrected after a failed KV load or a preemption; expected now and then, above 0.2 for 15 "
                    "minutes alert FuzzserveAccountingCorrectionsHigh fires."
                ),
                "percentunit",
                False,
                [
                    q(
                        f"sum by (ReplicaId, kind) (rate({CORRECTIONS}{{{R}}}"
                        "[$__rate_interval]))"
                        " / ignoring (kind) group_left sum by (ReplicaId) "
                        f"(rate({SUCCESS}{{{R}}}[$__rate_interval]))",
                        "{{ReplicaId}} {{kind}}",
                    )
                ],
            ),
        ],
    ),
    (
        "Traffic",
        [
            (
                "Prompt tokens per second by source, per replica",
                (
                    "Where each replica's prompt KV came from: computed, its own prefix cache, or the KV connector "
                    "(offload tier)."
                ),
                "short",
                True,
                [
                    q(
                        f"sum by (ReplicaId, source) (rate({BY_SOURCE}{{{R}, {SOURCES}}}[$__rate_interval]))",
                        "{{ReplicaId}} {{source}}",
                    )
                ],
            ),
            (
                "Finished requests per second by finish reason",
                "vllm:request_success by finished_reason (stop, length, abort, ...), all selected replicas.",
                "reqps",
                True,
                [
                    q(
                        f"sum by (finished_reason) (rate({SUCCESS}{{{R}}}[$__rate_interval]))",
                        "{{finished_reason}}",
                    )
                ],
            ),
            (
                "Generation tokens per second, per replica",
                "vllm:generation_tokens per replica.",
                "short",
                True,
                [
                    q(
                        f"sum by (ReplicaId) (rate({exported(GENERATION_TOKENS)}{{{R}}}[$__rate_interval]))",
                        "{{ReplicaId}}",
                    )
                ],
            ),
            (
                "Prompt tokens per second, per replica",
                "vllm:prompt_tokens per replica.",
                "short",
                True,
                [
                    q(
                        f"sum by (ReplicaId) (rate({PROMPT}{{{R}}}[$__rate_interval]))",
                        "{{ReplicaId}}",
                    )
                ],
            ),
            (
                "Admitted requests per second by fuzz mode and strength",
                (
                    "Requests the guard admitted, by fuzz_mode (none = s 0) and fuzz_strength (the smallest power of "
                    "ten >= s), all replicas of each application (Serve's replica label, not vLLM's ReplicaId: not "
                    "filtered)."
                ),
                "reqps",
                True,
                [
                    q(
                        f"sum by (fuzz_mode, fuzz_strength) (rate({ADMITTED}[$__rate_interval]))",
                        "{{fuzz_mode}} s <= {{fuzz_strength}}",
                    )
                ],
            ),
            (
                "Fuzzed share of admitted requests",
                (
                    "Admitted requests with fuzz_strength > 0 over all admitted requests, per application, over 5 "
                    "minutes (recording rule fuzzserve:fuzzed_request_share:rate5m)."
                ),
                "percentunit",
                False,
                [q(FUZZED_SHARE, "{{application}}")],
            ),
        ],
    ),
    (
        "Latency (vLLM's histograms, selected replicas)",
        [
            (
                "Time to first token",
                (
                    "vllm:time_to_first_token_seconds quantiles: the engine's first token, whatever its text, as the "
                    "load tests' TTFT (docs/load_tests.md#figures), which adds the HTTP path."
                ),
                "s",
                False,
                quantiles("ray_vllm_time_to_first_token_seconds"),
            ),
            (
                "Time per output token",
                "vllm:request_time_per_output_token_seconds quantiles (TPOT), by tokens as the load tests' TPOT.",
                "s",
                False,
                quantiles("ray_vllm_request_time_per_output_token_seconds"),
            ),
        ],
    ),
]


def timeseries(
    panel_id: int, x: int, y: int, title: str, description: str, unit: str, stacked: bool, targets: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "id": panel_id,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "custom": {
                    "drawStyle": "line",
                    "lineWidth": 1,
                    "fillOpacity": 10 if stacked else 0,
                    "stacking": {"mode": "normal" if stacked else "none", "group": "A"},
                },
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row_title, items in SECTIONS:
        panels.append(
            {
                "type": "row",
                "id": len(panels) + 1,
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, (title, description, unit, stacked, targets) in enumerate(items):
            panels.append(
                timeseries(len(panels) + 1, 12 * (i % 2), y + 8 * (i // 2), title, description, unit, stacked, targets)
            )
        y += 8 * ((len(items) + 1) // 2)
    return {
        "uid": UID,
        "title": "fuzzserve: accounting invariants and traffic",
        "description": "Per-replica vLLM counters of a fuzzserve Ray Serve deployment (ray_vllm_* by ReplicaId): "
        "the load tests' invariants, live. See docs/monitoring.md.",
        "tags": ["fuzzserve", "vllm", "ray-serve"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "type": "datasource",
                    "name": "datasource",
                    "label": "Data source",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "skipUrlSync": False,
                },
                {
                    "type": "query",
                    "name": "replica",
                    "label": "Replica (Ray ReplicaId)",
                    "datasource": DS,
                    "query": {"query": f"label_values({PROMPT}, ReplicaId)", "refId": "replica"},
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {},
                    "refresh": 2,
                    "sort": 1,
                    "hide": 0,
                    "regex": "",
                    "skipUrlSync": False,
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the committed file instead of writing it")
    args = ap.parse_args(argv)
    if args.check:
        if not DASHBOARD_FILE.exists() or DASHBOARD_FILE.read_text() != render():
            print(f"{DASHBOARD_FILE} is stale: run python -m monitoring.dashboard", file=sys.stderr)
            return 1
        return 0
    DASHBOARD_FILE.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_FILE.write_text(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
