"""Observing the replicas: scraping every node's metrics, reading each replica's counters, checking the invariants.

``scraper`` fetches and merges the endpoints' pages, ``counters`` reads one
replica's figures out of them, ``invariants`` states what must hold of one
scrape or two, and ``monitor`` runs the scrapes beside the load and keeps
every violation with its context. ``replica_metrics`` is the same reading as
a command (``python -m load_tests.observe.replica_metrics``).
"""
