#!/usr/bin/env bash
# Sets up a fresh machine (venv, Python packages, Slurm/munge from apt where possible)
# and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci_system_deps.sh
bash scripts/setup_env.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest -q "$@"
