#!/usr/bin/env bash
# Build (or find) the virtualenv that runs GEM (axon-rl's General Experience Maker, PyPI: gem-llm) for
# this project's side-by-side benchmark, and print its path.
#
#   bash .ci/gem_venv.sh [DIR]
#
# DIR defaults to $SEARCHQA_GEM_VENV, else ~/.cache/searchqa-gym/gem-venv (outside the work tree, so
# fresh clones and CI runs on the same machine reuse one build). GEM lives in a virtualenv of its own
# because gem-llm pins exact versions of nltk, reasoning-gym and msgspec (and math-verify's antlr
# runtime): beside our packages those pins would decide what later installs may upgrade.
#
# What goes in: gem-llm (pinned below), plus what its QA environment and search tool import at module
# level without declaring it outside the heavy "search" extra: datasets (gem.envs.qa_env) and requests
# (gem.tools.search_tool). This project goes in editable without extras (numpy, gymnasium, networkx,
# bm25s, tokenizers), for its GEM adapter's test (search_env/integrations/gem.py); the GEM side of the
# benchmark (benchmarks/peers/gem_answer_turn.py) still imports only GEM and the standard library.
#
# Idempotent and cached: a stamp file records the pins, BUILD_REVISION and the Python version; when it
# matches and the venv's interpreter imports GEM's ToolEnvWrapper and QaEnv, the script prints DIR and
# returns at once. Any mismatch rebuilds from scratch. Raise BUILD_REVISION when a change to the steps
# below must rebuild existing venvs. A lock file keeps two concurrent callers from building at once.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="${1:-${SEARCHQA_GEM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/searchqa-gym/gem-venv}}"
PY="${PYTHON:-python3}"

GEM_PIN="gem-llm==0.1.0"
EXTRA_PINS=("datasets>=2.14" "requests>=2.31")
BUILD_REVISION=2
WANT="$GEM_PIN|${EXTRA_PINS[*]}|$("$PY" -c 'import sys; print(sys.version.split()[0])')|$BUILD_REVISION"
STAMP="$DIR/.searchqa-gem-stamp"
CHECK='import gem.tools.tool_env_wrapper, gem.tools.search_tool, gem.envs.qa_env, search_env.integrations.gem'

ready() {
    [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$DIR/bin/python" ] \
        && "$DIR/bin/python" -c "$CHECK" >/dev/null 2>&1
}

if ready; then echo "$DIR"; exit 0; fi

mkdir -p "$(dirname "$DIR")"
exec 9>"$DIR.lock"
flock 9
if ready; then echo "$DIR"; exit 0; fi   # another caller built it while this one waited

echo "building the GEM virtualenv in $DIR (a few minutes)" >&2
rm -rf "$DIR"
"$PY" -m venv "$DIR"
PIP=("$DIR/bin/python" -m pip install --progress-bar off)
"${PIP[@]}" --upgrade pip wheel setuptools >&2
"${PIP[@]}" "$GEM_PIN" "${EXTRA_PINS[@]}" >&2
"${PIP[@]}" -e "$ROOT" >&2
# GEM's wrapper, tool and QA environment, and this project's adapter, must import, or the stamp is not written.
"$DIR/bin/python" -c "$CHECK; import importlib.metadata as m; print('gem venv ok: gem-llm', m.version('gem-llm'))" >&2
echo "$WANT" >"$STAMP"
echo "$DIR"
