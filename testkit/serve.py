"""What the tests' Ray Serve cluster (``tests/conftest.py`` ``serve_cluster``) is deployed with."""

from __future__ import annotations

# The API key its guard accepts (FUZZSERVE_API_KEYS).
SERVE_API_KEY = "test-key-fuzzserve"
