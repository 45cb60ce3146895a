#!/usr/bin/env bash
# The main job: set up (first run only), build the fixture model (first run
# only), run the patched vLLM engine on it and print a fuzz sweep.
# Extra arguments go to `python -m load_tests.fuzz_sweep` (try --help).
set -euo pipefail
source "$(dirname "$0")/env.sh"
python -m fixture_model.build >/dev/null
exec python -m load_tests.fuzz_sweep --json out/fuzz_sweep.json "$@"
