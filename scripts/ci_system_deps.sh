#!/usr/bin/env bash
# Installs the system packages the Slurm tests need (slurm-wlm, munge) from apt.
# Idempotent: does nothing when slurmctld is already installed. Where apt cannot be
# used (not root, no apt-get), it says so and returns 0: the Slurm tests then skip
# with their own message instead of failing the whole CI run here. Once it has installed
# them it leaves .slurm-installed-by-tests in the repository: from then on a local Slurm
# that does not start fails the Slurm tests instead of skipping them.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
    echo "ci_system_deps: slurm-wlm and munge already installed"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    echo "ci_system_deps: apt-get not found; Slurm tests will be skipped" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ci_system_deps: not root, cannot apt-get install slurm-wlm munge; Slurm tests will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if apt-get update -q && apt-get install -y -q --no-install-recommends slurm-wlm munge; then
    echo "ci_system_deps: installed slurm-wlm and munge"
    echo "slurm-wlm and munge installed by scripts/ci_system_deps.sh on $(date -u +%FT%TZ)" >.slurm-installed-by-tests
else
    echo "ci_system_deps: apt-get install slurm-wlm munge failed; Slurm tests will be skipped" >&2
fi
