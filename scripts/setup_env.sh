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
    # uv resolves, unpacks and byte-compiles in parallel: about 35 s here where pip took
    # 95 s. Byte-compiling matters: with PYTHONDONTWRITEBYTECODE set, as on these machines,
    # every process would otherwise recompile torch's modules at import (about 2 s each).
    # Pin the exact torch first: without a GPU this resolves to the CPU build where one is
    # provided locally (pip's find-links, which uv does not read by itself); on GPU
    # machines it is PyPI's CUDA build.
    if python -m pip install -q uv; then
        links=()
        for link in ${PIP_FIND_LINKS:-$(python -m pip config get global.find-links 2>/dev/null || true)}; do
            links+=(--find-links "$link")
        done
        uv pip install -q --compile-bytecode "${links[@]}" "torch==2.13.0"
        uv pip install -q --compile-bytecode -e ".[dev]"
    else
        echo "setup_env: uv could not be installed; installing with pip" >&2
        python -m pip install -q "torch==2.13.0"
        python -m pip install -q -e ".[dev]"
    fi
    touch "$stamp"
fi
