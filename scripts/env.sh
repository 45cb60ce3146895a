# Sourced by scripts/main.sh, scripts/test.sh and scripts/lint.sh (and by
# hand: `source scripts/env.sh`): build/reuse .venv and set the environment
# every command of the project runs under. No `set -e` here: it would leak
# into an interactive shell that sources this file; the scripts set it
# themselves.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Set-up prints its progress and its errors. Its import check imports Ray
# Serve LLM, which turns every library logger of that process into JSON lines
# on stderr (vLLM's and Triton's start-up notes): those below ERROR are not
# printed; everything else (pip's errors, the check's verdict) is.
"$ROOT/scripts/bootstrap.sh" 2> >(grep --line-buffered -v -E '^\{"asctime": .*"levelname": "(DEBUG|INFO|WARNING)"' >&2) || return 1
export PATH="$ROOT/.venv/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
cd "$ROOT"
# The environment of every command of the project and of `ray start` / `serve
# run` on every node, from its tables (serve_app/engine/cluster_env.py and
# serve_app/engine/engine_env.py: no model hub, the CPU engines' KV cache size,
# Serve's HAProxy and the request body forwarded to the ingress request router,
# which serve_config.yaml's direct path needs and without which the app
# refuses to deploy, naming them; Serve's controller loop interval; Ray's token
# authentication, with a token made if none exists, since `ray start` does not
# make one and `serve`, `ray` and ray.init must agree on the mode). A value
# already set wins.
fuzzserve_exports=$(python -m serve_app.engine.cluster_env) || return 1
eval "$fuzzserve_exports"
unset fuzzserve_exports
