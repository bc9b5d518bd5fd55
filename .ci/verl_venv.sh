#!/usr/bin/env bash
# Build (or find) the virtualenv that imports verl on the CPU, for the test of this project's verl tool
# (search_env/integrations/verl_tool.py), and print its path.
#
#   bash .ci/verl_venv.sh [DIR]
#
# DIR defaults to $SEARCHQA_VERL_VENV, else ~/.cache/searchqa-gym/verl-venv (outside the work tree, so
# fresh clones and CI runs on the same machine reuse one build). verl lives in a virtualenv of its own
# because it caps transformers below the version our "agents" extra needs, and pulls ray.
#
# What goes in: verl (pinned below) with its declared dependencies (no vLLM or SGLang: the tool needs
# neither), the CPU build of torch the main install uses, and this package, editable, without extras (the
# tool uses only search_env and rewards).
#
# Idempotent and cached: a stamp file records the pins, BUILD_REVISION and the Python version; when it
# matches and the venv's interpreter imports verl's BaseTool and this package's tool, the script prints
# DIR and returns at once. Any mismatch rebuilds from scratch. Raise BUILD_REVISION when a change to the
# steps below must rebuild existing venvs. A lock file keeps two concurrent callers from building at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-${SEARCHQA_VERL_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/searchqa-gym/verl-venv}}"
PY="${PYTHON:-python3}"

VERL_PIN="verl==0.9.1"
TORCH_PIN="torch==2.13.0"
BUILD_REVISION=1
WANT="$VERL_PIN|$TORCH_PIN|$("$PY" -c 'import sys; print(sys.version.split()[0])')|$BUILD_REVISION"
STAMP="$DIR/.searchqa-verl-stamp"
CHECK='import verl.tools.base_tool, search_env.integrations.verl_tool'

ready() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$DIR/bin/python" ] \
        && "$DIR/bin/python" -c "$CHECK" >/dev/null 2>&1
}

if ready; then echo "$DIR"; exit 0; fi

mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if ready; then echo "$DIR"; exit 0; fi   # another caller built it while this one waited

echo "building the verl virtualenv in $DIR (several minutes)" >&2
rm -rf "$DIR"
"$PY" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --progress-bar off)
"${PIP[@]}" --upgrade pip wheel setuptools >&2
"${PIP[@]}" "$TORCH_PIN" >&2
"${PIP[@]}" "$TORCH_PIN" "$VERL_PIN" >&2
"${PIP[@]}" "$TORCH_PIN" -e "$ROOT" >&2
# verl's tool base class and this package's tool must import, or the stamp is not written.
"$DIR/bin/python" -c "$CHECK; import importlib.metadata as m; print('verl venv ok: verl', m.version('verl'))" >&2
echo "$WANT" >"$STAMP"
echo "$DIR"
