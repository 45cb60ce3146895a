"""Investigations: each answered one question about where time or CPU goes, and is kept so that its answer can be
measured again (``benchmarks/README.md`` lists each with its question; the answers are in docs/benchmarks.md and
the results log). None is part of what a user runs to judge the project."""
