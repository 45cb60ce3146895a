"""Where the shipped monitoring files are: the Prometheus rules and scrape config, the Grafana dashboard."""

from __future__ import annotations

from pathlib import Path

MONITORING_DIR = Path(__file__).resolve().parent
PROMETHEUS_DIR = MONITORING_DIR / "prometheus"
RULES_FILE = PROMETHEUS_DIR / "fuzzserve-rules.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD_FILE = MONITORING_DIR / "grafana" / "fuzzserve-dashboard.json"
