#!/usr/bin/env bash
# The first minutes on any CUDA machine: one command, one markdown table.
#
#   bash bench/gpu_acceptance.sh --quick    # at most ~6 minutes on one H100, compile included
#   bash bench/gpu_acceptance.sh            # everything (tens of minutes); table also in $OUT_DIR/gpu_acceptance.md
#
# --quick: (1) CUDA is visible, else one line and exit 2; (2) the Triton kernels on GPT-2
# small's shape, every variant at precision auto, against the reference
# (bench/check_kernel_cuda.py --quick); (3) the trainer's own step (bench/train_step.py) of
# gpt2_small_mlp3072.toml as shipped (compiled, fused AdamW, micro-batch 32, global batch 64):
# tokens/s, MFU, peak memory, CE only and the step ratio of every variant; (4) the same for
# midtrain_qwen3_0.6b_baseline.toml with random weights (nothing downloaded: GPT-2's
# tokenizer and the embedded corpus stand in for Qwen's and WikiText's; global batch 4 of
# its micro-batches of 2), CE only and angular_spread. Estimated time on one H100 [E, not
# measured]: CUDA and versions 15 s; kernel check 60 s (Triton autotuning 5 variants × 2
# dtypes); GPT-2 small 150 s (start 25 s, inductor 60-90 s, kernel probes 20 s, 6 variants ×
# 4 steps of ~0.13-0.4 s); Qwen3-0.6B 100 s (start 30 s, inductor 60 s, 2 × 3 steps of ~0.3 s):
# about 5.5 minutes, less on a rerun (inductor's cache).
#
# Everything (no --quick), in order: (1) as above; (2) the Triton kernels at every
# precision against the reference on CUDA (bench/check_kernel_cuda.py); (3)
# bench/dispersion_loss.py at GPT-2 small's shape (B=16, N=1024, d=768, 12 layers) and
# Qwen3-1.7B's (B=1, N=4096, d=2048, 28 layers): triton at each precision vs lean (vs
# naive at GPT-2's); (4) bench/train_step.py on gpt2_small_mlp3072.toml:
# angular_spread, l2_repel and perplexity_entropy at each precision against CE only, then one step of each
# under torch.cuda.set_sync_debug_mode("warn"), counting implicit host syncs; (5) 20 steps
# of train_configs/debug.toml with angular_spread (coeff 0.1), compile and bf16 through
# launch/train.sh on all visible GPUs (with >= 2 GPUs: FSDP2 over them, then TP2); (6) the
# condensation analysis of that run's checkpoints on the GPU.
# bench/acceptance_table.py does the parsing (tested on CPU with canned lines).
# Each step's output is kept in $OUT_DIR/<step>.log; a failing step is marked in the
# table and the script goes on, exiting 1 at the end.
# Environment: OUT_DIR (default outputs/gpu_acceptance), PYTHON (default .venv/bin/python
# if present, else python).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python; fi
fi
export PYTHON  # launch/train.sh uses it too
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; elif [ -n "${1:-}" ]; then
    echo "gpu_acceptance.sh: unknown argument $1 (the only one is --quick)"; exit 2
fi
config() {  # config NAME: the shipped config NAME.toml wherever under train_configs/ it lives
    find train_configs/ -name "$1.toml" | head -n 1
}
GPT2_CONFIG=$(config gpt2_small_mlp3072)
QWEN3_CONFIG=$(config midtrain_qwen3_0.6b_baseline)

if ! "$PYTHON" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    echo "gpu_acceptance.sh: no CUDA device visible to torch ($PYTHON; or torch does not import there): nothing to measure"
    exit 2
fi

OUT_DIR=${OUT_DIR:-outputs/gpu_acceptance}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
RESULTS=$OUT_DIR/results.txt
: >"$RESULTS"
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

gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
"$PYTHON" - >>"$RESULTS" <<'EOF' || echo "versions=unreadable" >>"$RESULTS"
import subprocess, torch, triton
try:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True).stdout.split("\n")[0]
except FileNotFoundError:
    driver = "unknown(no-nvidia-smi)"
name = torch.cuda.get_device_name(0).replace(" ", "_")
print(f"device={name}x{torch.cuda.device_count()} torch={torch.__version__} triton={triton.__version__} "
      f"cuda={torch.version.cuda} driver={driver}")
EOF

if [ "$quick" = 1 ]; then
    run_step kernel_check "$PYTHON" bench/check_kernel_cuda.py --quick
    run_step train_step_gpt2 "$PYTHON" bench/train_step.py "$GPT2_CONFIG" --name gpt2_small --steps 3 --warmup 1 \
        --variants angular_spread orthogonalization l2_repel decorrelation perplexity_entropy
    run_step train_step_qwen3 "$PYTHON" bench/train_step.py "$QWEN3_CONFIG" --name qwen3_0.6b --steps 2 --warmup 1 \
        --variants angular_spread --model.hf_assets_path "" \
        --training.dataset enwiki_sample --training.global_batch_size 4
    "$PYTHON" bench/acceptance_table.py table "$RESULTS" "$OUT_DIR/gpu_acceptance.md" "$failed"
    exit "$failed"
fi

run_step kernel_check "$PYTHON" bench/check_kernel_cuda.py
run_step dispersion_loss "$PYTHON" bench/dispersion_loss.py --device cuda --B 16 --N 1024 --d 768 --layers 12 \
    --impls triton triton_tf32 triton_exact lean naive
run_step dispersion_loss_qwen3 "$PYTHON" bench/dispersion_loss.py --device cuda --B 1 --N 4096 --d 2048 --layers 28 \
    --dtype bf16 --variants angular_spread l2_repel perplexity_entropy --impls triton triton_tf32 triton_exact lean --repeats 2
run_step train_step "$PYTHON" bench/train_step.py "$GPT2_CONFIG" --name gpt2_small \
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

"$PYTHON" bench/acceptance_table.py table "$RESULTS" "$OUT_DIR/gpu_acceptance.md" "$failed"
exit "$failed"
