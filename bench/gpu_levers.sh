#!/usr/bin/env bash
# Issue 48's levers on one GPU in one call of at most 6 minutes, compile included: the node's pip freeze
# first, the offline install, then each step below in order, each on the same card, each in its own
# process, until LEVERS_LIMIT_S (default 300 s after the install) is spent; one table at the end. Not yet run on a GPU.
#
#   bash bench/gpu_levers.sh            # on the GPU node: device tool, carry ["wheelhouse", "gpu_cache"]
#   ONLY=liger,mb64 bash bench/gpu_levers.sh   # only these steps (a rerun of what did not fit)
#
# GPT-2 small as shipped (gpt2_small_mlp3072.toml: 64 × 1024 tokens, micro-batches of 32, compiled per
# block, fused AdamW), CE only, bench/train_step.py, 10 timed steps after 2 warm-ups, each step a process:
#   baseline       today's numerics on one GPU: TorchTitan's bf16 autocast over fp32 weights (--autocast)
#   bf16_params    the shipped path now: FSDP2 on a one-rank mesh, bf16 parameters and activations; beside
#                  it angular_spread at λ 0.1 on every block (its step ratio)
#   floor          the debug config's step (compiled, bf16, 20 timed after 5): the per-step floor of launches,
#                  Python and the optimizer that `plan` has no measurement of yet (issue 49)
#   whole_model    bf16_params + compile.whole_model
#   liger          bf16_params + training.head_loss = "liger" (the head and CE fused)
#   qkv            q, k, v in one GEMM against three, one micro-batch (bench/levers_check.py qkv)
#   profile_gpt2   bf16_params under the profiler: groups, idle and the top 30 kernels (bench/profile_step.py)
#   numerics       the first 200 debug steps of the bf16-parameter path (compiled, fused) against the
#                  autocast fp32-weight path, within the bf16 yardstick (autocast against fp32 training)
#   qwen3_default  Qwen3-0.6B (random weights, 4 × 4096 tokens), CE only, TorchTitan's SDPA backend list,
#                  profiled: its step and the attention kernels it runs
#   qwen3_cudnn    the same pinned to cuDNN (--sdpa-backend cudnn)
#   sdpa_pin       the pin's numerics: Qwen3-0.6B's attention, output and gradients, each against fp32 math
#   mb64           bf16_params at micro-batch 64 (one per step; `dispersion-titan plan ... --gpus 1 --gpu h100
#                  --training.max_local_batch_size 64`: 60.92 GB of 80, fits; CPU, 2026-11-28)
#   coord_descent  bf16_params with Inductor's coordinate-descent tuning (TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1)
#
# Files, all under OUT (the device tool's folder that comes back; default outputs/gpu_levers), at most 8:
# freeze.txt (pip freeze of the node's python3, before anything is installed), install.log, levers.log
# (every step's output in turn), results.txt (its RESULT lines, wall time and exit status), levers.md (the
# table, also printed), caches.tar.gz (Inductor's and Triton's caches, when under 15 MiB: carried back as
# gpu_cache/caches.tar.gz, which this script unpacks first, they save the next call's compiles).
# Environment: OUT; LEVERS_LIMIT_S; ONLY; PYTHON (else a venv installed offline from WHEELHOUSE, default
# ./wheelhouse, made by scripts/wheelhouse.sh, else python3); CACHE (default gpu_cache/caches.tar.gz).
# LEVERS_DEVICE=cpu runs every step on a CPU at a tiny shape (debug configs, aot_eager, Liger under
# Triton's interpreter, the math SDPA kernel as the pin): it checks the plumbing; its figures mean nothing.
# A failing step is marked in the table and the rest go on; the exit status is then 1.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
OUT=${OUT:-outputs/gpu_levers}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LIMIT=${LEVERS_LIMIT_S:-300}
cpu=0
[ "${LEVERS_DEVICE:-cuda}" = cpu ] && cpu=1
node_python=$(command -v python3 || command -v python || true)
[ -n "$node_python" ] || { echo "gpu_levers.sh: no python3 or python on PATH"; exit 2; }
"$node_python" -m pip freeze >"$OUT/freeze.txt" 2>&1  # first: what the node holds, whatever follows

work=$(mktemp -d /tmp/gpu_levers.XXXXXX)
if [ -z "${PYTHON:-}" ]; then
    wheelhouse=${WHEELHOUSE:-$REPO/wheelhouse}
    if [ -d "$wheelhouse" ]; then
        PYTHON=$node_python bash scripts/offline_install.sh "$wheelhouse" "$work/venv" >"$OUT/install.log" 2>&1 ||
            { echo "gpu_levers.sh: installing $wheelhouse failed: $(tail -n 1 "$OUT/install.log")"; exit 2; }
        PYTHON=$work/venv/bin/python
    else
        echo "no wheelhouse at $wheelhouse: $node_python as it is" >"$OUT/install.log"
        PYTHON=$node_python
    fi
else
    echo "PYTHON=$PYTHON given: nothing installed" >"$OUT/install.log"
fi
export PYTHON  # launch/train.sh uses it too

export TORCHINDUCTOR_CACHE_DIR=$work/cache/inductor TRITON_CACHE_DIR=$work/cache/triton
mkdir -p "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
cache=${CACHE:-$REPO/gpu_cache/caches.tar.gz}
[ ! -f "$cache" ] || tar -xzf "$cache" -C "$work/cache" || echo "gpu_levers.sh: $cache does not unpack; compiling anew"

GPT2=train_configs/gpt2_small_mlp3072.toml QWEN3=train_configs/paper/midtrain_qwen3_0.6b_baseline.toml
GPT2_ARGS=()
QWEN3_ARGS=(--model.hf_assets_path "" --training.dataset enwiki_sample --released.per_device_train_batch_size 0
    --training.global_batch_size 4 --training.local_batch_size 1)  # 4 × 4096 tokens as measured before, random weights
STEPS=(--steps 10 --warmup 2) WHOLE=(--compile.whole_model) PIN=cudnn NUMERICS_STEPS=200
FLOOR_ARGS=(--training.mixed_precision_param bfloat16 --compile.enable --steps 20 --warmup 5)
QKV=() SDPA=() LIGER_ENV=()
if [ "$cpu" = 1 ]; then  # the plumbing on a CPU: debug models, a few tokens, one step
    GPT2=train_configs/debug.toml QWEN3=train_configs/debug_qwen3_angular_spread.toml QWEN3_ARGS=()
    GPT2_ARGS=(--training.mixed_precision_param bfloat16)
    STEPS=(--steps 1 --warmup 0 --profile cpu --training.global_batch_size 2 --training.seq_len 16)
    WHOLE=(--compile.whole_model --compile.enable --compile.backend aot_eager) PIN=math NUMERICS_STEPS=3
    QKV=(--tokens 2x16 --dim 64) SDPA=(--seq 64 --head-dim 16) LIGER_ENV=(TRITON_INTERPRET=1)
    FLOOR_ARGS=(--steps 1 --warmup 0 --profile cpu)
fi
start=$SECONDS failed=0
: >"$OUT/results.txt"
: >"$OUT/levers.log"

run_step() {  # run_step NAME CMD...: unless ONLY leaves it out or the time is spent, run CMD into levers.log
    local name=$1 left=$((LIMIT - (SECONDS - start))) began=$SECONDS rc
    shift
    case ",${ONLY:-$name}," in *",$name,"*) ;; *) return ;; esac
    if [ "$left" -lt 15 ]; then echo "$name.skipped=time" >>"$OUT/results.txt"; return; fi
    echo "== $name: $*" | tee -a "$OUT/levers.log"
    timeout -k 10 "$left" "$@" >"$work/$name.log" 2>&1
    rc=$?
    cat "$work/$name.log" >>"$OUT/levers.log"
    tail -n 25 "$work/$name.log"
    "$PYTHON" bench/acceptance_table.py results "$work/$name.log" >>"$OUT/results.txt"
    echo "$name.wall_s=$((SECONDS - began)) $name.exit=$rc" >>"$OUT/results.txt"
    [ "$rc" -eq 0 ] || failed=1
}

TRAIN_STEP=("$PYTHON" bench/train_step.py "$GPT2" "${GPT2_ARGS[@]}" "${STEPS[@]}" --name)

numerics() {  # bf16 parameters (compiled, fused) | autocast fp32 weights | fp32: 200 debug steps side by side
    local common=(--training.steps "$NUMERICS_STEPS" --training.global_batch_size 4 --dispersion.variant angular_spread
        --dispersion.coeff 0.1 --checkpoint.no-enable --validation.no-enable --metrics.log_freq 1
        --training.mixed_precision_param bfloat16)
    local params=(--compile.enable --optimizer.implementation fused)
    local autocast=(--parallelism.data_parallel_shard_degree 1)
    local fp32=(--training.mixed_precision_param float32) run pids=() rc=0
    [ "$cpu" = 0 ] || { common+=(--profile cpu); params=(); }
    for run in params autocast fp32; do
        local -n extra=$run
        NPROC=1 bash launch/train.sh train_configs/debug.toml "${common[@]}" "${extra[@]}" \
            --job.dump_folder "$work/numerics_$run" >"$work/numerics_$run.log" 2>&1 &
        pids+=($!)
    done
    for run in "${pids[@]}"; do wait "$run" || rc=1; done
    tail -n 3 "$work"/numerics_{params,autocast,fp32}.log
    "$PYTHON" bench/acceptance_table.py numerics "$work"/numerics_{params,autocast,fp32}.log || rc=1
    return "$rc"
}
export -f numerics  # run_step's timeout runs it in a bash of its own
export cpu work NUMERICS_STEPS

"$PYTHON" - >>"$OUT/results.txt" <<'EOF' || echo "versions=unreadable" >>"$OUT/results.txt"
import torch, triton
name = (torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu").replace(" ", "_")
print(f"device={name} torch={torch.__version__} triton={triton.__version__} cuda={torch.version.cuda}")
EOF
run_step baseline "${TRAIN_STEP[@]}" baseline --variants --autocast
run_step bf16_params "${TRAIN_STEP[@]}" bf16_params --variants angular_spread
run_step floor "$PYTHON" bench/train_step.py train_configs/debug.toml "${FLOOR_ARGS[@]}" --name floor --variants
run_step whole_model "${TRAIN_STEP[@]}" whole_model --variants "${WHOLE[@]}"
run_step liger env "${LIGER_ENV[@]}" "${TRAIN_STEP[@]}" liger --variants --training.head_loss liger
run_step qkv "$PYTHON" bench/levers_check.py qkv "${QKV[@]}"
run_step profile_gpt2 "$PYTHON" bench/profile_step.py "$GPT2" "${GPT2_ARGS[@]}" "${STEPS[@]}" --name profile_gpt2
run_step numerics bash -c numerics
run_step qwen3_default "$PYTHON" bench/profile_step.py "$QWEN3" "${QWEN3_ARGS[@]}" "${STEPS[@]}" --name qwen3_default
run_step qwen3_cudnn "$PYTHON" bench/profile_step.py "$QWEN3" "${QWEN3_ARGS[@]}" "${STEPS[@]}" --name qwen3_cudnn \
    --sdpa-backend "$PIN"
run_step sdpa_pin "$PYTHON" bench/levers_check.py sdpa-pin --backend "$PIN" "${SDPA[@]}"
run_step mb64 "${TRAIN_STEP[@]}" mb64 --variants --training.max_local_batch_size 64
run_step coord_descent env TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 "${TRAIN_STEP[@]}" coord_descent --variants

tar -czf "$work/caches.tar.gz" -C "$work/cache" . 2>/dev/null
size=$(($(stat -c %s "$work/caches.tar.gz" 2>/dev/null || echo 0) / 1048576))
if [ "$size" -lt 15 ]; then cp "$work/caches.tar.gz" "$OUT/"; fi
echo "caches.mib=$size caches.returned=$([ "$size" -lt 15 ] && echo yes || echo no) total.wall_s=$((SECONDS - start))" \
    >>"$OUT/results.txt"
"$PYTHON" bench/acceptance_table.py table "$OUT/results.txt" "$OUT/levers.md" "$failed"
rm -rf "$work"
exit "$failed"
