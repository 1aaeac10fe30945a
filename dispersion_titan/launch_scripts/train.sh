#!/usr/bin/env bash
# Train on this node:  launch/train.sh CONFIG [--section.key value ...]
#   (or --job.config_file CONFIG first, as dispersion-titan train takes it)
# The overrides go straight to TorchTitan (python -m dispersion_titan.train --help lists
# the keys this package adds). Runs from any directory; relative paths
# (CONFIG, the run folder) are relative to the current one.
# Environment:
#   NPROC       processes on this node (default: the GPUs this node may use, else 2 on CPU)
#   LOG_RANK    local ranks whose output is shown, e.g. 0 (default) or 0,1; empty: all
#   PYTHON      interpreter (default: the active environment, else the repo's .venv)
#   OMP_NUM_THREADS  default: this node's CPUs (Slurm's CPUs per task) / NPROC
#   NNODES, RDZV_ENDPOINT, RDZV_ID  multi-node rendezvous (slurm/train.sbatch sets them)
#   DISPERSION_TITAN_ALLOW_CPU=1  train on CPU although this node has GPUs torch cannot use
# The configuration is checked once, in one process, for NNODES x NPROC processes before
# torchrun starts: bad input ends in one line and exit status 2; a run that already
# reached training.steps ends in one line and exit status 0.
# Exit status of a run (reliability.md in the dispersion_titan docs): 0 done; 130/143 stopped
# by SIGINT/SIGTERM (checkpoint saved); 75 preempted (PREEMPT_SIGNAL); 74 a checkpoint write
# failed, or a file the run needs did (a full disk, a file removed, a read-only file system);
# 3 non-finite loss; 137 a rank was SIGKILLed (kill -9, or the OOM killer); 1 any other failure.
set -euo pipefail
LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
. "$LAUNCH_DIR/common.sh"

[ $# -ge 1 ] || die "usage: launch/train.sh CONFIG [--section.key value ...]"
case $1 in  # the header above, without its comment marks
    -h|--help) sed -n '2,/^set -/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"; exit 0 ;;
esac
case $1 in  # as dispersion-titan train takes it
    --job.config_file=*|--job.config-file=*) config=${1#*=}; shift ;;
    --job.config_file|--job.config-file) [ $# -ge 2 ] || die "--job.config_file: missing value"; config=$2; shift 2 ;;
    *) config=$1; shift ;;
esac
require_config "$config"

gpus=$(gpu_count)
if [ "$gpus" -gt 0 ]; then default_nproc=$gpus; else default_nproc=2; fi
nproc=$(positive_int NPROC "${NPROC:-$default_nproc}")
nnodes=$(positive_int NNODES "${NNODES:-1}")
[[ "${RDZV_ENDPOINT:-localhost:0}" =~ ^(.+:[0-9]{1,5}|[^:]+|\[.+\])$ ]] || die "RDZV_ENDPOINT must be HOST or HOST:PORT, got '$RDZV_ENDPOINT'"
[[ "${LOG_RANK-0}" =~ ^([0-9]+(,[0-9]+)*)?$ ]] || die "LOG_RANK must be local ranks, e.g. 0 or 0,1 (empty: all), got '$LOG_RANK'"
IFS=, read -ra shown <<< "${LOG_RANK-0}"  # a rank this node does not start: its output hidden, no line shown
for rank in "${shown[@]}"; do
    [ $((10#$rank)) -lt "$nproc" ] || die "LOG_RANK $rank names no local rank of this node, which starts NPROC=$nproc processes (0..$((nproc - 1))); name one of them (empty: all)"
done
omp='[[:space:]]*\+?0*[1-9][0-9]*[[:space:]]*'  # libgomp's (else it warns on torch's import, and ignores it)
[[ "${OMP_NUM_THREADS:-1}" =~ ^$omp(,$omp)*$ ]] || die "OMP_NUM_THREADS must be a positive whole number of threads, e.g. 4, or unset; got '$OMP_NUM_THREADS'"
if [ -z "${OMP_NUM_THREADS:-}" ]; then
    # Without this torchrun sets 1 thread per process and leaves most cores idle.
    threads=$(($(cpu_count) / nproc))
    export OMP_NUM_THREADS=$((threads > 0 ? threads : 1))
fi
python=$(python_bin)
# torchrun would die of the preemption signal (default action); ignoring it here is
# inherited by torchrun, while each training rank installs its own handler
# (dispersion_titan/trainer/preemption.py), so signalling every process of the job is safe.
trap '' "$PREEMPT_SIGNAL" 2>/dev/null || die "PREEMPT_SIGNAL must be a signal name, e.g. USR1, got '$PREEMPT_SIGNAL'"

# One process checks everything first (config for this world size, output folders, GPUs,
# checkpoints): one line instead of one error per rank inside torchrun's report.
check=0
WORLD_SIZE=$((nnodes * nproc)) "$python" -m dispersion_titan.train --check-only \
    --job.config_file="$config" "$@" || check=$?  # "=": a CONFIG that starts with "-" is no option
case $check in
    0) ;;
    10) exit 0 ;;  # the run already reached training.steps: nothing to do (said in one line)
    *) exit "$check" ;;
esac

rank_filter=()
if [ -n "${LOG_RANK-0}" ]; then rank_filter=(--local-ranks-filter "${LOG_RANK-0}"); fi
rdzv_id=()
if [ -n "${RDZV_ID:-}" ]; then rdzv_id=(--rdzv_id "$RDZV_ID"); fi

# SIGINT and SIGTERM reach torchrun, which forwards them to the ranks: they save and stop.
# torchrun runs through dispersion_titan/torchrun.py, which ends it in one line.
export DISPERSION_TITAN_CHECKED=1  # the check above said the launch's notes ([released]'s layout): not again
exec "$python" -m dispersion_titan.torchrun \
    --nnodes "$nnodes" --nproc_per_node "$nproc" \
    --rdzv_backend c10d --rdzv_endpoint "${RDZV_ENDPOINT:-localhost:0}" "${rdzv_id[@]}" \
    "${rank_filter[@]}" --role rank --tee 3 \
    -m dispersion_titan.train --job.config_file="$config" "$@"
