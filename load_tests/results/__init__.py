"""The typed records of a run: what it did on purpose (``events``, a discriminated union) and what it found
(``models``: :class:`~load_tests.results.models.RunSummary`, which ``summary.json`` holds).

``python -m load_tests.results`` prints ``summary.json``'s JSON schema (docs/summary.schema.json).
"""
