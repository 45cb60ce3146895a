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
