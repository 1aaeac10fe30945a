#!/usr/bin/env bash
# Sets up a fresh machine (venv, Python packages, Slurm/munge from apt where possible),
# checks lint and format (ruff) and runs the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# apt (Slurm, munge) and the Python packages install side by side; apt's output follows.
apt_log=$(mktemp)
bash scripts/ci_system_deps.sh >"$apt_log" 2>&1 &
apt_pid=$!
bash scripts/setup_env.sh
apt_status=0
wait "$apt_pid" || apt_status=$?
cat "$apt_log"
rm -f "$apt_log"
if [ "$apt_status" -ne 0 ]; then
    echo "run_tests: scripts/ci_system_deps.sh failed with exit status $apt_status" >&2
    exit "$apt_status"
fi
. .venv/bin/activate
# Lint and format first (seconds): pyproject.toml's [tool.ruff].
ruff check .
ruff format --check .
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# The suite trains on CPU: the quickstart's glibc allocator settings (dispersion_titan.utils.devices),
# for every process it starts, Slurm jobs included; values already set win.
eval "$(python -c 'from dispersion_titan.utils.devices import CPU_MALLOC_ENV as e
print("\n".join(f"export {k}=${{{k}:-{v}}}" for k, v in e.items()))')"
# Three workers on two cores: a module often waits (rendezvous, Slurm scheduling, the
# trainer's closing sleep), and a third worker keeps both cores busy (vmstat: about 1 %
# idle during the run). Each module stays on one worker (tests/conftest.py).
python -m pytest -q -n "${PYTEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
