#!/usr/bin/env bash
# The first minutes on any CUDA machine: one command, one markdown table.
#
#   bash bench/gpu_acceptance.sh            # table also written to $OUT_DIR/gpu_acceptance.md
#
# In order: (1) CUDA is visible, else one line and exit 2; (2) the Triton kernels
# against the reference on CUDA (bench/check_kernel_cuda.py); (3) bench/dispersion_loss.py
# (B=16, N=1024, d=768, 12 layers: triton vs lean vs naive) and bench/train_step.py
# (GPT-2 small, seq 1024, bf16, compiled); (4) 20 steps of train_configs/debug.toml with
# angular_spread (coeff 0.1), compile and bf16 through launch/train.sh on all visible
# GPUs; (5) the condensation analysis of that run's checkpoints on the GPU.
# Each step's output is kept in $OUT_DIR/<step>.log; a failing step is marked in the
# table and the script goes on, exiting 1 at the end.
# Environment: OUT_DIR (default outputs/gpu_acceptance), PYTHON (default .venv/bin/python
# if present, else python), TRAIN_STEP_BATCH (bench/train_step.py's batch, default 8).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=$REPO/.venv/bin/python; else PYTHON=python; fi
fi
export PYTHON  # launch/train.sh uses it too

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
    grep '^RESULT ' "$OUT_DIR/$name.log" | sed 's/^RESULT //' >>"$RESULTS" || true
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

run_step kernel_check "$PYTHON" bench/check_kernel_cuda.py
run_step dispersion_loss "$PYTHON" bench/dispersion_loss.py --device cuda --B 16 --N 1024 --d 768 --layers 12
run_step train_step "$PYTHON" bench/train_step.py --device cuda --dtype bf16 --compile \
    --flavor small --seq-len 1024 --batch-size "${TRAIN_STEP_BATCH:-8}"

RUN=$OUT_DIR/debug_angular_spread
rm -rf "$RUN"
run_step train env NPROC="$gpus" bash launch/train.sh train_configs/debug.toml \
    --dispersion.variant angular_spread --dispersion.coeff 0.1 --training.steps 20 \
    --training.global_batch_size $((4 * gpus)) --compile.enable --training.mixed_precision_param bfloat16 \
    --job.dump_folder "$RUN"
# the last logged step of rank 0: loss, memory, tokens/s per GPU and TorchTitan's MFU
sed -n 's/.*step: *\([0-9]*\) .*loss: *\([0-9.]*\).*memory: *\([0-9.]*\)GiB.*tps: *\([0-9,]*\).*mfu: *\([0-9.]*\)%.*/train.step=\1 train.loss=\2 train.memory_gib=\3 train.tps_per_gpu=\4 train.mfu_pct=\5/p' \
    "$OUT_DIR/train.log" | tr -d ',' | tail -n 1 >>"$RESULTS"
sed -n 's/.*step: *\([0-9]*\) *ce: *\([0-9.]*\) *dispersion: *\(-*[0-9.]*\).*/train.ce=\2 train.dispersion=\3/p' \
    "$OUT_DIR/train.log" | tail -n 1 >>"$RESULTS"

run_step analyze "$PYTHON" -m dispersion_titan.analyze "$RUN" --device cuda --num-sequences 32 --seq-len 128
[ -f "$RUN/condensation/summary.csv" ] && "$PYTHON" - "$RUN/condensation/summary.csv" >>"$RESULTS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for step in sorted({int(r["step"]) for r in rows}):
    cos = [float(r["mean_cos_offdiag"]) for r in rows if int(r["step"]) == step]
    print(f"analyze.step{step}.mean_cos_offdiag_over_layers={statistics.fmean(cos):.4f}")
EOF

"$PYTHON" - "$RESULTS" "$OUT_DIR/gpu_acceptance.md" "$failed" <<'EOF'
import sys
results, table_file, failed = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
lines = ["| quantity | value |", "|---|---|"]
for line in open(results):
    for item in line.split():
        key, _, value = item.partition("=")
        lines.append(f"| {key} | {value} |")
lines.append(f"| all steps passed | {'no' if failed else 'yes'} |")
open(table_file, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"(written to {table_file})")
EOF
exit "$failed"
