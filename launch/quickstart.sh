#!/usr/bin/env bash
# The main job on a fresh machine, CPU only: bash launch/quickstart.sh [options]
# Sets up .venv (scripts/setup_env.sh; only package registries are contacted), then
# trains a toy GPT-2 MLP-width sweep (64/256/1024) with and without the dispersion loss
# on the embedded Wikipedia sample, analyses every checkpoint, compares the runs and
# prints a summary (also in $QUICKSTART_OUT/summary.md). About 10 minutes on 2 cores.
# Running it again only redoes what is missing.
# Environment:
#   QUICKSTART_OUT  output folder (default: outputs/quickstart)
# Options go to python -m dispersion_titan.quickstart (--help lists them).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "quickstart: setting up .venv (scripts/setup_env.sh)"
bash scripts/setup_env.sh
. .venv/bin/activate
exec python -m dispersion_titan.quickstart "$@"
