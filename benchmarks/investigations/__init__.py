"""Investigations: each asks one question about where time or CPU goes on the Serve path (each request's per-hop
budget: ``handoff_split``, ``request_timeline``; a lever against the shipped stack: ``interleaved``), kept while
that question is open (``benchmarks/README.md`` lists each with its question; the answers are in docs/benchmarks.md
and the results log). Those that answered theirs were retired: their findings, commands and last commits are in
docs/results_log.md. None is part of what a user runs to judge the project."""
