"""Driving the load: the HTTP client that sends one request and classifies its outcome, and the drivers that keep
requests in flight as a profile (or a changing level) says.

``fuzz_sweep`` is the fuzz accuracy sweep, through a deployment or offline
(``python -m load_tests.load.fuzz_sweep``).
"""
