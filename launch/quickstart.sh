#!/usr/bin/env bash
# The main job on a fresh machine, CPU only: bash launch/quickstart.sh [options]
# Sets up .venv (scripts/setup_env.sh; only package registries are contacted), measures
# condensation at initialization for GPT-2 small's shape at four MLP widths, trains a
# toy GPT-2 MLP-width sweep (64/256/1024) with and without the dispersion loss on the
# embedded Wikipedia sample, analyzes every checkpoint, compares the runs and sets each
# of the paper's findings against the measurements ($QUICKSTART_OUT/summary.md and
# summary.png). Its measured wall time is in docs/benchmarks.md ("Quickstart").
# Running it again only redoes what is missing.
# Environment:
#   QUICKSTART_OUT  output folder (default: outputs/quickstart in this clone)
#   PYTHON          interpreter with dispersion_titan installed, as for launch/train.sh; no .venv is
#                   set up then (default: this clone's .venv, set up first)
# Options go to python -m dispersion_titan.quickstart (--help lists them); their relative paths
# (--out, --config) are read from the folder it is run in, as every command's.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$REPO/launch/common.sh"
if [ -z "${PYTHON:-}" ]; then
    echo "quickstart: setting up .venv (scripts/setup_env.sh)"
    bash "$REPO/scripts/setup_env.sh"
    . "$REPO/.venv/bin/activate"
fi
python=$(python_bin)
export QUICKSTART_OUT=${QUICKSTART_OUT:-$REPO/outputs/quickstart}
exec "$python" -m dispersion_titan.quickstart "$@"
