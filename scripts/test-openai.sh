#!/usr/bin/env bash
# `onebit serve` through the official `openai` Python client (tests/python, pytest).
# Builds the release binary (unless ONEBIT names one), fetches the demo model if it is missing,
# keeps the client and pytest in a virtualenv in onebit's cache, and runs the tests.
# usage: scripts/test-openai.sh [PYTEST ARGS...]
#   ONEBIT=path/to/onebit  test this binary instead of building target/release/onebit
#   MODEL=path/to/model.gguf  serve this model instead of the demo model
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${XDG_CACHE_HOME:-$HOME/.cache}/onebit"
venv="$cache/venv-openai"
# Major versions pinned: the tests follow the client's 3.x types and exceptions.
reqs=("openai==3.*" "pytest==9.*")

if [ -z "${ONEBIT:-}" ]; then
  cargo build --release --locked -p onebit-cli
  export ONEBIT="$PWD/target/release/onebit"
fi
if [ -z "${MODEL:-}" ]; then
  python3 scripts/fetch_model.py "$cache/models"
  export MODEL="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
fi

# The virtualenv, made once and refreshed when the requirements change. Where Python has no
# venv module (Debian without python3-venv), the packages go into a folder on PYTHONPATH.
stamp="$venv/.onebit-requirements"
want="${reqs[*]}"
py="$venv/bin/python"
if [ ! -x "$py" ] && [ ! -d "$venv/site" ]; then
  python3 -m venv "$venv" 2>/dev/null || { rm -rf "$venv"; mkdir -p "$venv/site"; }
fi
if [ ! -x "$py" ]; then
  py=python3
  export PYTHONPATH="$venv/site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "installing ${reqs[*]} into $venv"
  export PIP_ROOT_USER_ACTION=ignore
  if [ "$py" = python3 ]; then
    python3 -m pip install -q --disable-pip-version-check --no-warn-conflicts --upgrade --target "$venv/site" \
      "${reqs[@]}"
  else
    "$py" -m pip install -q --disable-pip-version-check --upgrade "${reqs[@]}"
  fi
  echo "$want" >"$stamp"
fi

export PYTHONDONTWRITEBYTECODE=1
"$py" -m pytest tests/python -q -p no:cacheprovider "$@"
