#!/usr/bin/env bash
# Creates .venv (if missing) and installs dispersion_titan with its dev extras.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
stamp=.venv/.dispersion_titan-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    python -m pip install -q --upgrade pip
    # Pin the exact torch first: without a GPU this resolves to the CPU build where one is
    # provided locally; on GPU machines it is PyPI's CUDA build.
    python -m pip install -q "torch==2.13.0"
    python -m pip install -q -e ".[dev]"
    touch "$stamp"
fi
