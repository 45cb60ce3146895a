#!/usr/bin/env bash
# The main job: set up (first run only), build the fixture model (first run
# only), start a local Ray cluster, deploy serve_config.yaml (two patched vLLM
# replicas behind Serve's HAProxy and the fuzz-aware request router), run the
# stress scenario (256 concurrent fuzz streams for 3 minutes, every replica's
# counters watched), a fuzz sweep through the deployment, write the report to
# out/stress/, tear everything down.
# Exits non-zero if any invariant broke or any request was lost.
# Extra arguments go to `python -m load_tests` (try --help), e.g.
#   scripts/main.sh --scenario chaos
set -euo pipefail
source "$(dirname "$0")/env.sh"
echo "main: fixture model $(python -m fixture_model.build)" >&2
exec python -m load_tests --scenario stress "$@"
