"""The monitoring files' test rigs: promtool and Grafana-schema checks, the fixtures they run on, the end-to-end
run with a real Prometheus (``python -m testkit.monitoring.e2e``) and the capture that made the fixtures."""
