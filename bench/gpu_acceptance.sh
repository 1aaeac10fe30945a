#!/usr/bin/env bash
# The first minutes on any CUDA machine: issue 39's point-5 figures, in one markdown table.
#
#   bash bench/gpu_acceptance.sh --quick    # parts 1 and 2, each stopped after PART_LIMIT_S (255 s): < 9.5 min
#   bash bench/gpu_acceptance.sh --part 1   # 143 s cold on one H200 (2026-11-26), the install 30 s before it
#   bash bench/gpu_acceptance.sh --part 2   # 158 s right after part 1 on the same machine (same run)
#   bash bench/gpu_acceptance.sh --part 3   # issue 39's point 6, one candidate at a time, after part 1
#   bash bench/gpu_acceptance.sh            # everything (tens of minutes)
#
# Part 1: versions; GPT-2 small (gpt2_small_mlp3072.toml as shipped: compiled, fused AdamW,
# micro-batch 32, global batch 64) CE only through the trainer's own step (bench/train_step.py):
# tokens/s, MFU, peak memory; the Triton kernels at precision auto, every variant, fp32 and bf16
# inputs at GPT-2 small's shape, and condensed inputs against the bf16 yardstick
# (bench/check_kernel_cuda.py --quick); the fast path's first 50 debug steps against the eager
# fp32-weight path and fp32 training (three launch/train.sh runs side by side): |fast - eager|
# within |bf16 - fp32|.
# Part 2: GPT-2 small's step ratio for every variant against CE only; its grouped profile
# (bench/profile_step.py, angular_spread); Qwen3-0.6B CE only (random weights: nothing downloaded;
# GPT-2's tokenizer and the embedded corpus stand in); the loss kernels' sustained TFLOP/s (FLOP
# floor over time) at Qwen3-1.7B's shape, one call per layer, and at GPT-2 small's training shape (its
# 12 blocks of a micro-batch of 32 in one call, bf16), each beside KERNEL_BASELINE's kernel where set
# (bench/dispersion_loss.py); last, the plan's peak memory and step time of GPT-2 small against the
# measured ones (bench/plan_gpu_check.py). Part 2 reuses part 1's Triton and inductor caches: run on a
# cold machine it takes longer.
# Part 3: point 6's candidates, each against part 2's CE-only step on the same machine: Qwen3-0.6B with
# SDPA pinned to cuDNN's attention (bench/train_step.py --sdpa-backend cudnn; 1.25x faster on an H200;
# GPT-2 small's default already runs cuDNN's kernels).
# Measured on one H200, cold (2026-11-26, docs/benchmarks.md), each step's wall time: part 1: GPT-2 CE
# 41 s, kernel check 30 s, numerics 72 s; part 2: variants 45 s, profile 33 s, Qwen3-0.6B 38 s, kernel
# rate 21 s, plan check 21 s. A slower machine may cut a part: run it again alone on the warm machine
# (its caches make it faster).
#
# Everything (no option), in order: parts 1, 2 and 3; the Triton kernels at every precision
# (bench/check_kernel_cuda.py); bench/dispersion_loss.py at GPT-2 small's and Qwen3-1.7B's shapes
# against the torch paths; angular_spread, l2_repel and perplexity_entropy at each precision with
# the implicit host syncs of one step; 20 debug steps through launch/train.sh on all GPUs (>= 2:
# FSDP2, then TP2); the condensation analysis of that run on the GPU.
#
# A failing step (or variant, in bench/train_step.py) is marked in the table and the rest goes on;
# the exit status is then 1; a part stopped at its limit in --quick leaves a partN.timed_out row.
# Each step's output is kept in $OUT_DIR/<step>.log, its figures appended to $OUT_DIR/results.txt
# (--quick, --part 1 and a full run start it anew); the table of every figure so far goes to stdout
# and $OUT_DIR/gpu_acceptance.md (bench/acceptance_table.py parses; tested on CPU).
# Environment: KERNEL_BASELINE, an earlier commit's dispersion_triton.py to time beside today's
# (`git show REV:dispersion_titan/losses/dispersion_triton.py > baseline_kernel.py` before the tree
# is copied to the GPU machine); OUT_DIR (default outputs/gpu_acceptance); PYTHON, else a venv installed offline from
# WHEELHOUSE (default ./wheelhouse, made by scripts/wheelhouse.sh) into ACCEPTANCE_VENV (default
# outputs/gpu_acceptance_venv) when that folder exists, else .venv, else python3, else python.
# ACCEPTANCE_DEVICE=cpu runs the same steps on a CPU (less the plan check and GPT-2's kernel rate) with the
# debug configs (--profile cpu, a few steps, Qwen3's shrunk): it checks the script's plumbing; its figures mean nothing.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
usage="bench/gpu_acceptance.sh [--part 1 | --part 2 | --part 3 | --quick]"
mode=full
case "${1:-}" in
    "") ;;
    --quick) mode=quick ;;
    --part)
        case "${2:-}" in
            1|2|3) mode=part$2 ;;
            *) echo "gpu_acceptance.sh: --part takes 1, 2 or 3 ($usage)"; exit 2 ;;
        esac ;;
    *) echo "gpu_acceptance.sh: unknown argument $1 ($usage)"; exit 2 ;;
esac
cpu=0
[ "${ACCEPTANCE_DEVICE:-cuda}" = cpu ] && cpu=1
OUT_DIR=${OUT_DIR:-outputs/gpu_acceptance}

if [ -z "${PYTHON:-}" ]; then
    wheelhouse=${WHEELHOUSE:-$REPO/wheelhouse}
    venv=${ACCEPTANCE_VENV:-$REPO/outputs/gpu_acceptance_venv}
    node_python=$(command -v python3 || command -v python || true)
    if [ -d "$wheelhouse" ]; then
        if [ ! -x "$venv/bin/python" ]; then
            [ -n "$node_python" ] || { echo "gpu_acceptance.sh: no python3 or python on PATH"; exit 2; }
            mkdir -p "$OUT_DIR"
            PYTHON=$node_python bash scripts/offline_install.sh "$wheelhouse" "$venv" >"$OUT_DIR/install.log" 2>&1 ||
                { echo "gpu_acceptance.sh: installing $wheelhouse failed: $(tail -n 1 "$OUT_DIR/install.log")"
                  exit 2; }
        fi
        PYTHON=$venv/bin/python
    elif [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python
    elif [ -n "$node_python" ]; then PYTHON=$node_python
    else echo "gpu_acceptance.sh: no python3 or python on PATH"; exit 2
    fi
fi
export PYTHON  # launch/train.sh uses it too

if [ "$cpu" = 0 ]; then
    if ! cuda=$("$PYTHON" -c 'import torch; print(torch.cuda.is_available())' 2>&1); then
        echo "gpu_acceptance.sh: torch does not import with $PYTHON: $(echo "$cuda" | tail -n 1)"; exit 2
    fi
    if [ "$(echo "$cuda" | tail -n 1)" != True ]; then
        echo "gpu_acceptance.sh: no CUDA device visible to torch ($PYTHON): nothing to measure"; exit 2
    fi
fi

mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)

config() {  # config NAME: the shipped config NAME.toml wherever under train_configs/ it lives
    find train_configs/ -name "$1.toml" | head -n 1
}
GPT2_CONFIG=$(config gpt2_small_mlp3072)
GPT2_PROFILE_CONFIG=$(config gpt2_small_mlp3072_angular_spread)
QWEN3_CONFIG=$(config midtrain_qwen3_0.6b_baseline)
QWEN3_ARGS=(--model.hf_assets_path "" --training.dataset enwiki_sample --released.per_device_train_batch_size 0
    --training.global_batch_size 4 --training.local_batch_size 1)  # 4 × 4096 tokens, not [released]'s layout
STEPS=(--steps 3 --warmup 1)
SDPA_PIN=cudnn
NUMERICS_STEPS=50
RESULTS=$OUT_DIR/results.txt
if [ "$cpu" = 1 ]; then  # the plumbing on a CPU: debug models, the CPU profile, one step of a few tokens
    GPT2_CONFIG=train_configs/debug.toml GPT2_PROFILE_CONFIG=train_configs/debug_angular_spread.toml
    QWEN3_CONFIG=train_configs/debug_qwen3_angular_spread.toml
    # Qwen3's debug flavor shrunk, 43M parameters to 3.3M (its first step took 11 s of CPU; now about 1 s)
    QWEN3_ARGS=(--model.n_layers 2 --model.dim 64 --model.n_heads 2 --model.n_kv_heads 1 --model.head_dim 32
        --model.mlp_hidden_dim 256)
    STEPS=(--steps 1 --warmup 0 --profile cpu --training.global_batch_size 2 --training.seq_len 16)
    NUMERICS_STEPS=3
    SDPA_PIN=math  # no cuDNN on a CPU
fi
failed=0

run_step() {  # run_step NAME CMD...: run CMD, log to $OUT_DIR/NAME.log, collect its RESULT lines and wall time
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name: $*"
    set +e
    "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    "$PYTHON" bench/acceptance_table.py results "$OUT_DIR/$name.log" >>"$RESULTS" || true
    echo "$name.wall_s=$((SECONDS - start)) $name.exit=$rc" >>"$RESULTS"
    if [ "$rc" -ne 0 ]; then failed=1; fi
}

versions() {
    "$PYTHON" - "$PYTHON" >>"$RESULTS" <<'EOF' || echo "versions=unreadable" >>"$RESULTS"
import subprocess, sys, torch
try:
    import triton
    triton_version = triton.__version__
except ImportError:
    triton_version = "none"
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.split("\n")[0] or "none"
except FileNotFoundError:
    driver = "none(no-nvidia-smi)"
name = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu").replace(" ", "_")
print(f"device={name}x{max(torch.cuda.device_count(), 1)} torch={torch.__version__} triton={triton_version} "
      f"cuda={torch.version.cuda} driver={driver} python={sys.argv[1]}")
EOF
}

numerics() {  # the fast path's first steps against the eager fp32-weight path, and bf16 against fp32 training
    local common=(--training.steps "$NUMERICS_STEPS" --training.global_batch_size 4 --dispersion.variant angular_spread
        --dispersion.coeff 0.1 --checkpoint.no-enable --validation.no-enable --metrics.log_freq 1)
    local fast=(--training.mixed_precision_param bfloat16 --compile.enable --optimizer.implementation fused)
    local eager=(--training.mixed_precision_param bfloat16 --parallelism.data_parallel_shard_degree 1)  # autocast
    local fp32=(--training.mixed_precision_param float32)
    [ "$cpu" = 0 ] || { common+=(--profile cpu); fast=(--training.mixed_precision_param bfloat16); }
    local run pids=() rc=0
    for run in fast eager fp32; do
        local -n extra=$run
        rm -rf "$OUT_DIR/numerics_$run"
        NPROC=1 bash launch/train.sh train_configs/debug.toml "${common[@]}" "${extra[@]}" \
            --job.dump_folder "$OUT_DIR/numerics_$run" >"$OUT_DIR/numerics_$run.log" 2>&1 &
        pids+=($!)
    done
    for run in "${pids[@]}"; do wait "$run" || rc=1; done
    "$PYTHON" bench/acceptance_table.py numerics "$OUT_DIR"/numerics_{fast,eager,fp32}.log || rc=1
    return "$rc"
}

part1() {  # the steps of each part by importance: a part stopped at its limit loses its last ones
    run_step train_step_gpt2_ce "$PYTHON" bench/train_step.py "$GPT2_CONFIG" --name gpt2_small --variants "${STEPS[@]}"
    run_step kernel_check "$PYTHON" bench/check_kernel_cuda.py --quick
    run_step numerics numerics
}

part2() {
    run_step train_step_gpt2 "$PYTHON" bench/train_step.py "$GPT2_CONFIG" --name gpt2_small "${STEPS[@]}" \
        --variants angular_spread orthogonalization l2_repel decorrelation perplexity_entropy
    run_step profile_gpt2 "$PYTHON" bench/profile_step.py "$GPT2_PROFILE_CONFIG" "${STEPS[@]}"
    run_step train_step_qwen3_ce "$PYTHON" bench/train_step.py "$QWEN3_CONFIG" --name qwen3_0.6b --variants \
        "${STEPS[@]}" "${QWEN3_ARGS[@]}"
    local kernels=(--impls triton)
    [ -z "${KERNEL_BASELINE:-}" ] || kernels=(--impls triton triton_baseline --baseline-kernel "$KERNEL_BASELINE")
    run_step kernel_rate_qwen3_1.7b "$PYTHON" bench/dispersion_loss.py --device cuda --B 1 --N 4096 --d 2048 \
        --layers 28 --dtype bf16 --variants angular_spread l2_repel perplexity_entropy "${kernels[@]}" --repeats 3 \
        --no-memory
    # on a CPU the step above already shows a CUDA-only step failing in its row; this one would again
    [ "$cpu" = 1 ] || run_step kernel_rate_gpt2 "$PYTHON" bench/dispersion_loss.py --device cuda --B 32 --N 1024 \
        --d 768 --layers 12 --dtype bf16 --batched --variants angular_spread l2_repel perplexity_entropy \
        "${kernels[@]}" --repeats 3 --no-memory
    [ "$cpu" = 1 ] || run_step plan_gpu_gpt2 "$PYTHON" bench/plan_gpu_check.py "$GPT2_CONFIG"  # issue 42: plan vs GPU
}

part3() {
    run_step train_step_qwen3_ce_cudnn "$PYTHON" bench/train_step.py "$QWEN3_CONFIG" --name qwen3_0.6b_cudnn \
        --variants "${STEPS[@]}" "${QWEN3_ARGS[@]}" --sdpa-backend "$SDPA_PIN"
}

table() {  # the table of every figure so far (not in a part that --quick runs: it prints the table itself)
    [ -n "${ACCEPTANCE_IN_QUICK:-}" ] || "$PYTHON" bench/acceptance_table.py table "$RESULTS" \
        "$OUT_DIR/gpu_acceptance.md" "$failed"
    exit "$failed"
}

case $mode in
    part1) [ -n "${ACCEPTANCE_IN_QUICK:-}" ] || : >"$RESULTS"; [ -s "$RESULTS" ] || versions; part1; table ;;
    part2) [ -s "$RESULTS" ] || versions; part2; table ;;
    part3) [ -s "$RESULTS" ] || versions; part3; table ;;
    quick)
        : >"$RESULTS"
        versions
        for part in 1 2; do  # timeout ends the part's whole process group, its running step too
            set +e
            ACCEPTANCE_IN_QUICK=1 OUT_DIR=$OUT_DIR timeout -k 10 "${PART_LIMIT_S:-255}" bash "$0" --part "$part"
            rc=$?
            set -e
            if [ "$rc" -ne 0 ]; then failed=1; fi
            if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then echo "part$part.timed_out=1" >>"$RESULTS"; fi
        done
        table ;;
esac

: >"$RESULTS"
versions
part1
part2
part3
gpus=$("$PYTHON" -c 'import torch; print(max(torch.cuda.device_count(), 1))')
run_step kernel_check_all "$PYTHON" bench/check_kernel_cuda.py
run_step dispersion_loss "$PYTHON" bench/dispersion_loss.py --device cuda --B 16 --N 1024 --d 768 --layers 12 \
    --impls triton triton_tf32 triton_exact lean naive
run_step dispersion_loss_qwen3 "$PYTHON" bench/dispersion_loss.py --device cuda --B 1 --N 4096 --d 2048 --layers 28 \
    --dtype bf16 --variants angular_spread l2_repel perplexity_entropy --impls triton triton_tf32 triton_exact lean \
    --repeats 2
run_step train_step_precisions "$PYTHON" bench/train_step.py "$GPT2_CONFIG" --name gpt2_small \
    --variants angular_spread l2_repel perplexity_entropy --precisions auto tf32 exact --sync-debug

RUN=$OUT_DIR/debug_angular_spread
rm -rf "$RUN"
train_args=(--dispersion.variant angular_spread --dispersion.coeff 0.1 --training.steps 20
    --training.global_batch_size $((4 * gpus)) --compile.enable --training.mixed_precision_param bfloat16)
run_step train env NPROC="$gpus" bash launch/train.sh train_configs/debug.toml "${train_args[@]}" \
    --job.dump_folder "$RUN"
"$PYTHON" bench/acceptance_table.py train "$OUT_DIR/train.log" >>"$RESULTS"
if [ "$gpus" -ge 2 ]; then  # NCCL: FSDP2 over every GPU, then tensor parallel over two
    run_step train_fsdp2 env NPROC="$gpus" bash launch/train.sh train_configs/debug.toml "${train_args[@]}" \
        --parallelism.data_parallel_shard_degree "$gpus" --job.dump_folder "$OUT_DIR/debug_fsdp2"
    run_step train_tp2 env NPROC=2 bash launch/train.sh train_configs/debug.toml "${train_args[@]}" \
        --training.global_batch_size 4 --parallelism.tensor_parallel_degree 2 --job.dump_folder "$OUT_DIR/debug_tp2"
fi

run_step analyze "$PYTHON" -m dispersion_titan.analyze "$RUN" --device cuda --num-sequences 32 --seq-len 128
[ -f "$RUN/condensation/summary.csv" ] && "$PYTHON" - "$RUN/condensation/summary.csv" >>"$RESULTS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for step in sorted({int(r["step"]) for r in rows}):
    cos = [float(r["mean_cos_offdiag"]) for r in rows if int(r["step"]) == step]
    print(f"analyze.step{step}.mean_cos_offdiag_over_layers={statistics.fmean(cos):.4f}")
EOF
table
