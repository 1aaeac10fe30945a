#!/usr/bin/env bash
# Train on this node:  launch/train.sh CONFIG [--section.key value ...]
# The overrides go straight to TorchTitan. Runs from any directory; relative paths
# (CONFIG, the dump folder) are relative to the current one.
# Environment:
#   NPROC       processes on this node (default: the GPUs this node may use, else 2 on CPU)
#   LOG_RANK    local ranks whose output is shown, e.g. 0 (default) or 0,1; empty: all
#   PYTHON      interpreter (default: the active environment, else the repo's .venv)
#   OMP_NUM_THREADS  default on CPU: this node's CPUs / NPROC
#   NNODES, RDZV_ENDPOINT, RDZV_ID  multi-node rendezvous (slurm/train.sbatch sets them)
set -euo pipefail
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$LAUNCH_DIR/common.sh"

[ $# -ge 1 ] || die "usage: launch/train.sh CONFIG [--section.key value ...]"
config=$1
shift
[ -f "$config" ] || die "config file not found: $config"

gpus=$(gpu_count)
if [ "$gpus" -gt 0 ]; then default_nproc=$gpus; else default_nproc=2; fi
nproc=$(positive_int NPROC "${NPROC:-$default_nproc}")
nnodes=$(positive_int NNODES "${NNODES:-1}")
if [ "$gpus" -eq 0 ] && [ -z "${OMP_NUM_THREADS:-}" ]; then
    # Without this torchrun sets 1 thread per process and leaves most cores idle.
    threads=$(($(cpu_count) / nproc))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi

rank_filter=()
if [ -n "${LOG_RANK-0}" ]; then rank_filter=(--local-ranks-filter "${LOG_RANK-0}"); fi
rdzv_id=()
if [ -n "${RDZV_ID:-}" ]; then rdzv_id=(--rdzv_id "$RDZV_ID"); fi

# torchrun would die of the preemption signal (default action); ignoring it here is
# inherited by torchrun, while each training rank installs its own handler
# (dispersion_titan/trainer/preemption.py), so signalling every process of the job is safe.
trap '' "$PREEMPT_SIGNAL"
exec "$(python_bin)" -m torch.distributed.run \
    --nnodes "$nnodes" --nproc_per_node "$nproc" \
    --rdzv_backend c10d --rdzv_endpoint "${RDZV_ENDPOINT:-localhost:0}" "${rdzv_id[@]}" \
    "${rank_filter[@]}" --role rank --tee 3 \
    -m dispersion_titan.train --job.config_file "$config" "$@"
