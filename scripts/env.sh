# Sourced by scripts/main.sh and scripts/test.sh (and by hand: `source
# scripts/env.sh`): build/reuse .venv and set the environment every command of
# the project runs under. No `set -e` here: it would leak into an interactive
# shell that sources this file; the scripts set it themselves.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$ROOT/scripts/bootstrap.sh" || return 1
export PATH="$ROOT/.venv/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# No model hub is reachable: never try one.
export HF_HUB_OFFLINE=1
# vLLM's CPU worker otherwise sizes its KV cache from free RAM (~92%).
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
cd "$ROOT"
# The environment of `ray start` / `serve run` for every node, from its one
# table (serve_app/cluster_env.py: Serve's HAProxy and the request body
# forwarded to the ingress request router, which serve_config.yaml's direct
# path needs and without which the app refuses to deploy, naming them; Serve's
# controller loop interval). A value already set wins.
eval "$(python -m serve_app.cluster_env)"
# Ray: token authentication on, and a token to use (Ray 2.60's `ray start`
# enables token auth only when a token file exists, and does not create one;
# `serve`, `ray` and ray.init must all agree on the mode).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [[ "$RAY_AUTH_MODE" == token && -z "${RAY_AUTH_TOKEN:-}" && ! -f "${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}" ]]; then
    ray get-auth-token --generate >/dev/null
fi
