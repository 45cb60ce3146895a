"""The Prometheus rules (monitoring/prometheus/), checked and unit-tested with the real promtool.

The rules file is written from the observability contract (serve_app/observability/contract.py) by ``python -m
monitoring.rules``; tests/test_observability_contract.py checks that, and each alert against its load-test twin.

Each alert gets a bad case (it must fire, with exactly these labels and this
summary) and a good twin (it must stay silent). Then the same rules run on the
series a real deployment exported (tests/fixtures/monitoring/, captured by
``python -m testkit.monitoring.capture``): the healthy export raises only the alert
its injected faults explain, and the same export with one replica's counters
made inconsistent raises the invariant alert, with the real label set. Last,
the checkers themselves can fail: a rule made wrong, and its unit tests fail.

promtool comes from ``scripts/install_promtool.sh`` (run by the bootstrap);
without it these tests fail, never skip.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from load_tests.observe.prom_text import Labels
from monitoring.files import RULES_FILE, SCRAPE_CONFIG
from patches.definitions.metrics import LYING_CONNECTOR_KINDS, VIOLATION_KINDS
from serve_app.observability.contract import (
    BY_SOURCE,
    CACHED,
    CORRECTIONS,
    HEALTH_CHECK_FAILURES,
    HEALTH_GAUGE,
    PROMPT,
    SUCCESS,
    VIOLATIONS,
)
from serve_app.observability.fuzz_traffic import EXPORTED
from testkit.monitoring.e2e import e2e_config
from testkit.monitoring.fixtures import FIXTURE_DIR, fixture_samples, series_selector
from testkit.monitoring.promtool import AlertCase, ExprCase, Firing, alerting_rules, promtool, run_rule_tests

LABELS = {
    "ReplicaId": "r1",
    "WorkerId": "w1",
    "engine": "0",
    "model_name": "fixture",
    "instance": "127.0.0.1:8089",
    "job": "ray",
}


def sel(name: str, **extra: str) -> str:
    return series_selector(name, {**LABELS, **extra})


def labels(**extra: str) -> dict[str, str]:
    return {**LABELS, **extra}


HEALTHY = HEALTH_GAUGE
FAILURES = HEALTH_CHECK_FAILURES


def parts(local_compute: str, local_cache_hit: str, external_kv_transfer: str) -> dict[str, str]:
    return {
        sel(BY_SOURCE, source="local_compute"): local_compute,
        sel(BY_SOURCE, source="local_cache_hit"): local_cache_hit,
        sel(BY_SOURCE, source="external_kv_transfer"): external_kv_transfer,
    }


R2_PROMPT = series_selector(PROMPT, {**LABELS, "ReplicaId": "r2", "WorkerId": "w2"})


def deployment_counters(errors: str, requests: str) -> dict[str, str]:
    lab = {
        "application": "fuzzserve",
        "deployment": "LLMServer:fixture",
        "replica": "r1",
        "instance": "127.0.0.1:8089",
        "job": "ray",
    }
    return {
        series_selector("ray_serve_deployment_error_counter_total", lab): errors,
        series_selector("ray_serve_deployment_request_counter_total", lab): requests,
    }


def failures(**replicas: str) -> dict[str, str]:
    """Serve's failed health checks per replica, as its controller exports them."""
    return {
        series_selector(
            FAILURES,
            {
                "application": "fuzzserve",
                "deployment": "LLMServer:fixture",
                "replica": r,
                "instance": "127.0.0.1:8089",
                "job": "ray",
            },
        ): values
        for r, values in replicas.items()
    }


def healthy(**replicas: str) -> dict[str, str]:
    return {
        series_selector(
            HEALTHY,
            {
                "application": "fuzzserve",
                "deployment": "LLMServer:fixture",
                "replica": r,
                "instance": "127.0.0.1:8089",
                "job": "ray",
            },
        ): values
        for r, values in replicas.items()
    }


CASES = [
    # --- a counter below 0
    AlertCase(
        "negative counter fires",
        {sel(PROMPT): "-3x10"},
        "1m",
        {"FuzzserveCounterNegative": [Firing(labels(counter=PROMPT), f"{PROMPT} is negative (-3) on replica r1")]},
    ),
    AlertCase("non-negative counter is silent", {sel(PROMPT): "0x10"}, "1m", {"FuzzserveCounterNegative": []}),
    # --- a counter that went down within one replica's life
    AlertCase(
        "decrease fires",
        {sel(SUCCESS, finished_reason="stop"): "0+10x5 42 52 62"},
        "2m",
        {
            "FuzzserveCounterWentBackwards": [
                Firing(
                    labels(finished_reason="stop", counter=SUCCESS),
                    f"{SUCCESS} went backwards 1 time(s) on replica r1 in 15 minutes",
                )
            ]
        },
    ),
    AlertCase(
        "monotone counters and a restart under a new ReplicaId are silent",
        {
            sel(SUCCESS, finished_reason="stop"): "0+10x8 _x8",
            series_selector(
                SUCCESS, {**LABELS, "ReplicaId": "r2", "WorkerId": "w2", "finished_reason": "stop"}
            ): "_x8 0+1x8",
        },
        "4m",
        {"FuzzserveCounterWentBackwards": []},
    ),
    # --- parts not summing to the total at rest
    AlertCase(
        "parts short of the total at rest fire",
        {sel(PROMPT): "100x30", **parts("60x30", "30x30", "_x30")},
        "5m",
        {
            "FuzzservePromptTokensDoNotSum": [
                Firing(labels(), "replica r1: prompt_tokens minus its sources = 10 at rest")
            ]
        },
    ),
    AlertCase(
        "a replica with prompt tokens and no source series at all fires",
        {sel(PROMPT): "100x30"},
        "5m",
        {
            "FuzzservePromptTokensDoNotSum": [
                Firing(labels(), "replica r1: prompt_tokens minus its sources = 100 at rest")
            ]
        },
    ),
    AlertCase(
        "parts that sum are silent",
        {sel(PROMPT): "100x30", **parts("60x30", "30x30", "10x30")},
        "5m",
        {"FuzzservePromptTokensDoNotSum": []},
    ),
    AlertCase(
        "parts lagging the total by one export while admitting, then catching up, are silent",
        # prompt counts 100 per scrape for 4 minutes; the parts trail one scrape behind, then rest equal
        {sel(PROMPT): "0+100x16 1600x20", **parts("0 0+100x15 1600x20", "_x37", "_x37")},
        "9m",
        {"FuzzservePromptTokensDoNotSum": []},
    ),
    AlertCase(
        "a mismatch seen only while admitting stays pending, not firing",
        {sel(PROMPT): "0+100x40", **parts("0 0+100x39", "_x40", "_x40")},
        "9m",
        {"FuzzservePromptTokensDoNotSum": []},
    ),
    # --- cached beyond the total
    AlertCase(
        "cached beyond the total at rest fires",
        {sel(PROMPT): "100x30", sel(CACHED): "120x30", **parts("100x30", "_x30", "_x30")},
        "5m",
        {
            "FuzzservePromptTokensCachedExceedTotal": [
                Firing(labels(), "replica r1: more prompt tokens cached than prompted (120)")
            ]
        },
    ),
    AlertCase(
        "cached within the total is silent",
        {sel(PROMPT): "100x30", sel(CACHED): "40x30", **parts("60x30", "40x30", "_x30")},
        "5m",
        {"FuzzservePromptTokensCachedExceedTotal": []},
    ),
    # --- the accounting patch's violations
    AlertCase(
        "an internal violation fires the critical alert, not the connector one",
        {sel(VIOLATIONS, kind="negative_increment"): "1x10"},
        "1m",
        {
            "FuzzserveAccountingViolation": [
                Firing(
                    labels(kind="negative_increment"), "accounting patch clamped 1 x negative_increment on replica r1"
                )
            ],
            "FuzzserveKVConnectorReportsRejected": [],
        },
    ),
    AlertCase(
        "a lying connector fires the connector alert, not the critical one",
        {sel(VIOLATIONS, kind="connector_negative"): "18x10"},
        "1m",
        {
            "FuzzserveKVConnectorReportsRejected": [
                Firing(
                    labels(kind="connector_negative"),
                    "KV connector reported impossible matches on replica r1: 18 x connector_negative",
                )
            ],
            "FuzzserveAccountingViolation": [],
        },
    ),
    AlertCase(
        "no violation series is silent",
        {sel(PROMPT): "0+10x10"},
        "1m",
        {"FuzzserveAccountingViolation": [], "FuzzserveKVConnectorReportsRejected": []},
    ),
    # --- corrections per finished request
    AlertCase(
        "corrections on 60% of requests for 15 minutes fire",
        {sel(CORRECTIONS, kind="after_load_failure"): "0+6x160", sel(SUCCESS, finished_reason="length"): "0+10x160"},
        "30m",
        {
            "FuzzserveAccountingCorrectionsHigh": [
                Firing(labels(), "replica r1: 60% of finished requests needed their prompt-token stats corrected")
            ]
        },
    ),
    AlertCase(
        "corrections on 10% of requests are silent",
        {sel(CORRECTIONS, kind="after_load_failure"): "0+1x160", sel(SUCCESS, finished_reason="length"): "0+10x160"},
        "30m",
        {"FuzzserveAccountingCorrectionsHigh": []},
    ),
    # --- a replica Serve no longer reports healthy, whose series Ray still exports
    AlertCase(
        "a replica that died 3 minutes ago, its series frozen, fires",
        {sel(PROMPT): "500x40", R2_PROMPT: "700x40", **healthy(r1="1x40", r2="1x8 0x32"), **failures(r2="_x8 1x32")},
        "6m",
        {
            "FuzzserveReplicaSeriesStale": [
                Firing(
                    {"ReplicaId": "r2"},
                    "replica r2 died (failed Serve's health checks), but its vLLM counters are still exported",
                )
            ]
        },
    ),
    AlertCase(
        "a replica Serve retired 3 minutes ago (redeploy, scale-down: no failed health check) is silent",
        {sel(PROMPT): "500x40", R2_PROMPT: "700x40", **healthy(r1="1x40", r2="1x8 0x32")},
        "6m",
        {"FuzzserveReplicaSeriesStale": [], "FuzzserveReplicaDied": []},
    ),
    AlertCase(
        "healthy replicas are silent",
        {sel(PROMPT): "500x40", R2_PROMPT: "700x40", **healthy(r1="1x40", r2="1x40")},
        "5m",
        {"FuzzserveReplicaSeriesStale": []},
    ),
    AlertCase(
        "a replica that died over 30 minutes ago is silent again",
        {
            sel(PROMPT): "500x200",
            R2_PROMPT: "700x200",
            **healthy(r1="1x200", r2="1x8 0x192"),
            **failures(r2="_x8 1x192"),
        },
        "45m",
        {"FuzzserveReplicaSeriesStale": [], "FuzzserveReplicaDied": []},
    ),
    # --- a replica that failed Serve's health checks (crashed, hung, lost its node)
    AlertCase(
        "a replica that failed health checks and is not healthy fires, its node's series gone or not",
        {**healthy(r1="1x40", r2="1x8 0x32"), **failures(r2="_x8 1x2 3x30")},
        "6m",
        {
            "FuzzserveReplicaDied": [
                Firing(
                    {"application": "fuzzserve", "deployment": "LLMServer:fixture", "replica": "r2"},
                    "replica r2 of fuzzserve/LLMServer:fixture failed Serve's health checks and is not healthy",
                )
            ]
        },
    ),
    AlertCase(
        "one failed health check of a replica that stays healthy is silent",
        {**healthy(r1="1x40"), **failures(r1="_x8 1x32")},
        "6m",
        {"FuzzserveReplicaDied": []},
    ),
    AlertCase(
        "no Serve health series: silent (a scrape gap is not a dead replica)",
        {sel(PROMPT): "500x40"},
        "5m",
        {"FuzzserveReplicaSeriesStale": []},
    ),
    # --- a deployment whose requests keep failing (stock accounting: EngineCore dies, replacements too)
    AlertCase(
        "90% of a deployment's requests failing for minutes fires",
        deployment_counters("0+9x40", "0+1x40"),
        "10m",
        {
            "FuzzserveDeploymentRequestsFailing": [
                Firing(
                    {"application": "fuzzserve", "deployment": "LLMServer:fixture"},
                    "fuzzserve/LLMServer:fixture: 90% of its requests raised errors over 5 minutes",
                )
            ]
        },
    ),
    AlertCase(
        "1% of requests failing (a replica kill's in-flight requests) is silent",
        deployment_counters("0+1x40", "0+99x40"),
        "10m",
        {"FuzzserveDeploymentRequestsFailing": []},
    ),
]


def test_promtool_is_installed_by_the_project():
    """The set-up installs it; a missing promtool fails here (and every test below), never skips."""
    r = promtool("--version")
    assert r.ok and "promtool, version" in r.output, r.output


def test_a_missing_promtool_is_an_error_not_a_skip(monkeypatch, tmp_path: Path):
    from testkit.monitoring import tools

    monkeypatch.setattr(tools, "TOOLS_BIN", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(tools.ToolMissing, match=r"install_promtool.sh"):
        promtool("--version")


def test_rules_and_scrape_config_pass_promtool_checks():
    r = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES_FILE))
    assert r.ok, r.output
    r = promtool("check", "config", str(SCRAPE_CONFIG))
    assert r.ok, r.output
    assert "/tmp/fzs-0/ray/prom_metrics_service_discovery.json" in SCRAPE_CONFIG.read_text()


def test_every_alert_has_a_good_and_a_bad_case_and_its_texts():
    rules = alerting_rules()
    firing = {a for c in CASES for a, f in c.expect.items() if f}
    silent = {a for c in CASES for a, f in c.expect.items() if not f}
    assert firing == set(rules) and silent == set(rules), (set(rules) - firing, set(rules) - silent)
    for name, rule in rules.items():
        ann = rule.get("annotations", {})
        assert {"summary", "description", "runbook"} <= set(ann), name
        assert rule.get("labels", {}).get("severity") in ("critical", "warning"), name
        for static in ("description", "runbook"):  # copied verbatim into the unit tests' expectations
            assert "{{" not in ann[static], f"{name}.{static} must be static text"


def test_violation_kinds_split_like_the_load_tests():
    """Connector-caused kinds (the load tests' expected kinds under a lying connector) warn; every other kind,
    including any kind added later, is critical."""
    rules = alerting_rules()
    crit_match = re.search(r'kind!~"([^"]+)"', rules["FuzzserveAccountingViolation"]["expr"])
    warn_match = re.search(r'kind=~"([^"]+)"', rules["FuzzserveKVConnectorReportsRejected"]["expr"])
    assert crit_match is not None and warn_match is not None
    crit, warn = crit_match.group(1), warn_match.group(1)
    assert crit == warn and set(warn.split("|")) == set(LYING_CONNECTOR_KINDS)
    assert set(LYING_CONNECTOR_KINDS) <= set(VIOLATION_KINDS)


def test_alerts_fire_on_bad_series_and_stay_silent_on_good_ones():
    r = run_rule_tests(list(CASES))  # a list of the parameter's element type (list is invariant)
    assert r.ok, r.output


def real_export_case(name: str, edit=None) -> tuple[dict[str, str], dict[tuple[str, Labels], float]]:
    """The captured export as flat promtool series (counters at rest), optionally edited."""
    samples = fixture_samples()
    if edit:
        samples = edit(samples)
    return {series_selector(n, lab): f"{v:g}x40" for (n, lab), v in samples.items()}, samples


def test_the_real_export_raises_only_what_its_faults_explain():
    """The capture ran the chaos engine settings with the patches on: the lying connector's rejected reports are
    the only alert, once per (replica, kind), with the real label set; no invariant alert."""
    series, samples = real_export_case("real")
    connector = [(lab, v) for (n, lab), v in samples.items() if n == VIOLATIONS]
    assert connector and {dict(lab)["kind"] for lab, _ in connector} <= set(LYING_CONNECTOR_KINDS)
    rules = alerting_rules()
    expect: dict[str, list[Firing]] = {a: [] for a in rules}
    expect["FuzzserveKVConnectorReportsRejected"] = [
        Firing(
            dict(lab),
            f"KV connector reported impossible matches on replica "
            f"{dict(lab)['ReplicaId']}: {v:g} x {dict(lab)['kind']}",
        )
        for lab, v in connector
    ]
    r = run_rule_tests([AlertCase("captured export at rest", series, "5m", expect)])
    assert r.ok, r.output


def test_the_real_export_with_a_broken_sum_fires_on_that_replica():
    def add_seven(samples):
        out = dict(samples)
        key = min(k for k in samples if k[0] == PROMPT)
        out[key] = samples[key] + 7
        return out

    series, samples = real_export_case("broken", add_seven)
    replica_labels = dict(min(k for k in samples if k[0] == PROMPT)[1])
    r = run_rule_tests(
        [
            AlertCase(
                "captured export, one replica's total off by 7",
                series,
                "5m",
                {
                    "FuzzservePromptTokensDoNotSum": [
                        Firing(
                            replica_labels,
                            f"replica {replica_labels['ReplicaId']}: prompt_tokens minus its sources = 7 at rest",
                        )
                    ]
                },
            )
        ]
    )
    assert r.ok, r.output


ADMITTED = EXPORTED
SHARE = "fuzzserve:fuzzed_request_share:rate5m"
RATE = "fuzzserve:admitted_requests:rate5m"


def admitted(replica: str, mode: str, strength: str) -> str:
    return series_selector(
        ADMITTED,
        {
            "application": "fuzzserve",
            "deployment": "LLMServer:fixture",
            "replica": replica,
            "fuzz_mode": mode,
            "fuzz_strength": strength,
            "instance": "127.0.0.1:8089",
            "job": "ray",
        },
    )


RECORD_CASES = [
    # 4 unfuzzed requests/s, 1 gaussian at s in (1, 10] and 3 scale at s in (1e-3, 1e-2], over two replicas
    ExprCase(
        "fuzz traffic by mode and strength, and the fuzzed share",
        {
            admitted("r1", "none", "0"): "0+60x40",
            admitted("r1", "gaussian", "1e+01"): "0+15x40",
            admitted("r2", "scale", "1e-02"): "0+45x40",
        },
        "8m",
        [SHARE],
        [{"labels": f'{SHARE}{{application="fuzzserve"}}', "value": 0.5}],
    ),
    ExprCase(
        "admitted rate summed over replicas per mode and strength",
        {
            admitted("r1", "scale", "1e-02"): "0+15x40",
            admitted("r2", "scale", "1e-02"): "0+45x40",
            admitted("r2", "none", "0"): "0+15x40",
        },
        "8m",
        [RATE],
        [
            {"labels": f'{RATE}{{application="fuzzserve",fuzz_mode="none",fuzz_strength="0"}}', "value": 1},
            {"labels": f'{RATE}{{application="fuzzserve",fuzz_mode="scale",fuzz_strength="1e-02"}}', "value": 4},
        ],
    ),
    ExprCase(
        "no fuzzed request yet: the share is 0, not absent",
        {admitted("r1", "none", "0"): "0+60x40"},
        "8m",
        [SHARE],
        [{"labels": f'{SHARE}{{application="fuzzserve"}}', "value": 0}],
    ),
]


def test_fuzz_traffic_records():
    r = run_rule_tests(list(RECORD_CASES))  # a list of the parameter's element type (list is invariant)
    assert r.ok, r.output


@pytest.mark.parametrize(
    "wrong, right",
    [
        ("fuzzserve:vllm_counter < 0", "fuzzserve:vllm_counter < -5"),
        ("resets(fuzzserve:vllm_counter[15m]) > 0", "resets(fuzzserve:vllm_counter[15m]) > 1"),
        ("fuzzserve:prompt_tokens_unaccounted != 0 and", "fuzzserve:prompt_tokens_unaccounted > 10 and"),
        ("changes(ray_vllm_prompt_tokens_total[2m]) == bool 0", "changes(ray_vllm_prompt_tokens_total[2m]) >= bool 0"),
        ("or 0 * ray_vllm_prompt_tokens_total", "or ray_vllm_prompt_tokens_total"),
        ("> 0.2", "> 0.7"),
        ("> 0.1", "> 0.95"),
        ("[30m]) == 1", "[30m]) >= 0"),
        (
            'ray_serve_deployment_replica_healthy == 1, "ReplicaId"',
            'ray_serve_deployment_replica_healthy >= 0, "ReplicaId"',
        ),
        (
            "(ray_serve_health_check_failures_total) > 0,",
            "(ray_serve_health_check_failures_total) >= 0 or ray_serve_deployment_replica_healthy,",
        ),
        (
            "unless on (replica) ray_serve_deployment_replica_healthy == 1",
            "unless on (replica) ray_serve_deployment_replica_healthy == 2",
        ),
        (
            "ray_serve_health_check_failures_total unless ray_serve_health_check_failures_total offset 30m)",
            "ray_serve_health_check_failures_total)",
        ),
        ('{fuzz_mode!="none"}', '{fuzz_mode!="scale"}'),
        ("or 0 * sum by (application)", "or sum by (application)"),
        ("sum by (application, fuzz_mode, fuzz_strength)", "sum by (application, fuzz_mode)"),
    ],
)
def test_a_wrong_rule_fails_its_unit_tests(tmp_path: Path, wrong: str, right: str):
    """The unit tests can fail: each of these edits breaks one rule, and promtool must say so."""
    text = RULES_FILE.read_text()
    assert wrong in text
    bad = tmp_path / "rules.yml"
    bad.write_text(text.replace(wrong, right))
    r = run_rule_tests(CASES + RECORD_CASES, rules_file=bad)
    assert not r.ok and "FAILED" in r.output, r.output


def discovered(config: dict, tmp_path: Path) -> list[dict]:
    """What promtool's service discovery (and relabelling) makes of ``config``'s job "ray"."""
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    # promtool waits the whole timeout for more results; a file is read at once
    r = promtool("check", "service-discovery", "--timeout=3s", str(path), "ray")
    assert r.ok, r.output
    return json.JSONDecoder().raw_decode(r.output[r.output.index("[") :])[0]


def test_scrape_config_finds_every_target_of_rays_discovery_file(tmp_path: Path):
    """The shipped config, its discovery file swapped for one a real cluster wrote: every listed endpoint is a
    target of job "ray"."""
    sd_file = FIXTURE_DIR / "prom_metrics_service_discovery.json"
    cfg = yaml.safe_load(SCRAPE_CONFIG.read_text())
    cfg.pop("rule_files")
    (sd,) = cfg["scrape_configs"][0]["file_sd_configs"]
    assert sd["files"] == ["/tmp/fzs-0/ray/prom_metrics_service_discovery.json"]
    sd["files"] = [str(sd_file)]
    targets = discovered(cfg, tmp_path)
    listed = [t for g in json.loads(sd_file.read_text()) for t in g["targets"]]
    assert sorted(t["labels"]["instance"] for t in targets) == sorted(listed)
    assert {t["labels"]["job"] for t in targets} == {"ray"}


def test_e2e_config_is_the_shipped_one_on_loopback(tmp_path: Path):
    cfg = e2e_config(RULES_FILE, 5)
    cfg["scrape_configs"][0]["file_sd_configs"][0]["files"] = [str(FIXTURE_DIR / "prom_metrics_service_discovery.json")]
    cfg.pop("rule_files")
    targets = discovered(cfg, tmp_path)
    assert targets and all(t["labels"]["__address__"].startswith("127.0.0.1:") for t in targets)
