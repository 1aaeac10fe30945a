# Helpers shared by the launch scripts (sourced, not run).
# shellcheck shell=bash

# The scripts live in the package (dispersion_titan/launch_scripts/), which a checkout's
# launch/ links to: with the links resolved, a checkout's root is two folders up (in an
# installed package that is site-packages, which holds no .venv).
REPO_DIR=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)
PREEMPT_SIGNAL=${PREEMPT_SIGNAL:-USR1}
export PREEMPT_SIGNAL  # read by the training ranks (dispersion_titan/trainer/preemption.py)

die() {  # die MESSAGE: one line on stderr naming the script (a job's own $script, not Slurm's copy), exit 2
    echo "$(basename "${script:-$0}"): error: $*" >&2
    exit 2
}

require_config() {  # require_config CONFIG: a file, or die saying what it is
    [ ! -d "$1" ] || die "config file $1 is a folder; give the TOML file itself"
    [ -f "$1" ] || die "config file not found: $1"
}

positive_int() {  # positive_int NAME VALUE: VALUE, or die naming NAME
    [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
    echo "$2"
}

python_bin() {
    # PYTHON wins (the sweep and paper --slurm set it to the interpreter that submits, the one
    # with this package); then the active virtualenv/conda environment; then the checkout's
    # .venv (scripts/setup_env.sh makes it); then python3.
    if [ -n "${PYTHON:-}" ]; then
        command -v "$PYTHON" >/dev/null || die "PYTHON: '$PYTHON' is no interpreter to run; unset it, or name one"
        echo "$PYTHON"
    elif [ -n "${VIRTUAL_ENV:-}${CONDA_PREFIX:-}" ] && command -v python >/dev/null; then
        command -v python
    elif [ -x "$REPO_DIR/.venv/bin/python" ]; then
        echo "$REPO_DIR/.venv/bin/python"
    else
        echo python3
    fi
}

gpu_count() {  # GPUs this node may use: CUDA_VISIBLE_DEVICES, else Slurm's count, else nvidia-smi
    if [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
        # Set but empty (or -1) hides every GPU.
        local ids=${CUDA_VISIBLE_DEVICES//[^,]/}
        case "$CUDA_VISIBLE_DEVICES" in "" | -1 | NoDevFiles) echo 0 ;; *) echo $((${#ids} + 1)) ;; esac
    elif [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
        echo "$SLURM_GPUS_ON_NODE"
    elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        nvidia-smi -L | grep -c '^GPU'
    else
        echo 0
    fi
}

cpu_count() {  # CPUs this task may use: Slurm's CPUs per task or on the node, else the affinity mask
    # (GNU nproc would answer OMP_NUM_THREADS instead, when that is set)
    echo "${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}}"
}

dump_folder_override() {  # dump_folder_override ARGS...: the (last) --job.dump_folder value in ARGS
    local value=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --job.dump_folder | --job.dump-folder) value=${2:-}; shift ;;
            --job.dump_folder=* | --job.dump-folder=*) value=${1#*=} ;;
        esac
        shift
    done
    echo "$value"
}

refuse_short_time_limit() {  # refuse_short_time_limit LIMIT LEAD: die where the warning LEAD s before Slurm's
    # LIMIT ([D-]H:M:S, as scontrol shows it) would stop every attempt at its start, to checkpoint and requeue again
    local days=0 clock=$1 h m s
    [[ "$clock" =~ ^([0-9]+-)?[0-9]+:[0-9]+:[0-9]+$ ]] || return 0  # UNLIMITED, Partition_Limit, ...
    if [[ "$clock" == *-* ]]; then days=${clock%%-*}; clock=${clock#*-}; fi
    IFS=: read -r h m s <<<"$clock"
    local least=$(($2 + 60)) # sbatch --signal: sent up to 60 s sooner
    [ $((10#$days * 86400 + 10#$h * 3600 + 10#$m * 60 + 10#$s)) -gt "$least" ] ||
        die "time limit $1 leaves no time to train: this job is signalled $2 s before it (Slurm may signal 60 s" \
            "sooner) to checkpoint and requeue; give sbatch --time more than $(printf '%02d:%02d:%02d' \
            $((least / 3600)) $((least % 3600 / 60)) $((least % 60))), or signal later: sbatch --signal=B:USR1@60 --export=ALL,PREEMPT_LEAD=60"
}
