#!/usr/bin/env bash
# The tests: set up (first run only), then pytest. Extra arguments go to pytest
# (e.g. `scripts/test.sh -m "not engine"` for the fast unit tests only).
set -euo pipefail
source "$(dirname "$0")/env.sh"
exec python -m pytest "$@"
