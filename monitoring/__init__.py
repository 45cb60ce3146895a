"""Production monitoring of the load tests' invariants: Prometheus rules, scrape config, Grafana dashboard."""
