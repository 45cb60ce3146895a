#!/usr/bin/env bash
# The tests: set up (first run only), the lint (scripts/lint.sh), then pytest. Extra arguments go to pytest
# (e.g. `scripts/test.sh -m "not engine"` for the fast unit tests only).
set -euo pipefail
source "$(dirname "$0")/env.sh"
# The lint first (ruff format check, ruff lint, mypy; scripts/lint.sh): a finding fails the run before pytest.
"$ROOT/scripts/lint.sh"
# --durations: CI logs name the slowest tests (the 90-minute budget on 2 cores).
exec python -m pytest --durations=25 "$@"
