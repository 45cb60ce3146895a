#!/usr/bin/env bash
# The main job: set up (first run only), build the fixture model (first run
# only), start a local Ray cluster, deploy serve_config.yaml (the fuzz router
# and two patched vLLM replicas), send fuzz requests over HTTP, print the
# results and the per-replica counters, tear everything down.
# Extra arguments go to `python -m load_tests.main_job` (try --help).
set -euo pipefail
source "$(dirname "$0")/env.sh"
python -m fixture_model.build >/dev/null
exec python -m load_tests.main_job "$@"
