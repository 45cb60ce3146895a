"""The plan of a load run: scenarios, load profiles, the request mix, SLOs and operation steps.

Frozen data and pure functions only (no I/O, no clock): what a run will do,
never how. Everything else in ``load_tests`` reads it; it reads nothing of
``load_tests``.
"""
