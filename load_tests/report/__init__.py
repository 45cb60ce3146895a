"""Reporting a run: ``summary.json``, ``requests.jsonl``, ``report.md`` with its plots, and the console table."""
