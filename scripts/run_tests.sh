#!/usr/bin/env bash
# Sets up a fresh machine (venv, Python packages, Slurm/munge from apt where possible)
# and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ci_system_deps.sh
bash scripts/setup_env.sh
. .venv/bin/activate
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The suite trains on CPU: the quickstart's glibc allocator settings (dispersion_titan.devices),
# for every process it starts, Slurm jobs included; values already set win.
eval "$(python -c 'from dispersion_titan.devices import CPU_MALLOC_ENV as e
print("\n".join(f"export {k}=${{{k}:-{v}}}" for k, v in e.items()))')"
# Three workers on two cores: the suite waits (rendezvous, Slurm, checkpoint writes, one-
# process phases) about half its time; each module stays on one worker (tests/conftest.py).
python -m pytest -q -n "${PYTEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
