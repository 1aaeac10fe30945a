"""A cost model of the dispersion loss on one H100 SXM: a PREDICTION, not a measurement.

For each shipped GPU config it takes the Triton kernel's issued matmul work and glue traffic
(counted by ``tests/kernel_accounting.issued``, which tests/test_dispersion_kernel.py checks
against the interpreter's own count) and H100 SXM's published peaks (989 TFLOP/s dense bf16,
3.35 TB/s HBM3), and predicts per micro-batch:

- the model's step: 6 FLOPs per parameter per token plus attention, at an assumed MFU;
- the loss: its FLOPs at a sustained kernel rate (the rate measured on an H100 in
  docs/benchmarks.md, and at 50% of peak), its traffic at peak bandwidth, 5 µs per launch;
  the chosen blocks go through the kernels as one batch (one set of launches per step's
  micro-batch, whatever the number of blocks), at the price of copying them into it;
  perplexity_entropy's pair products are split-precision tf32 (tf32x3): three tf32 dots,
  at half the bf16 rate;
- the step ratio, loss on against CE only. Targets: ≤ 1.10 (GPT-2 small), ≤ 1.15 (Qwen3-1.7B).

``--fast-path`` prints instead the model's own step on the fast path (compiled blocks and
loss, fused AdamW, bf16 autocast, the config's micro-batch): a roofline of its GEMMs,
attention, the memory traffic of its saved activations, LM head and optimizer, the MFU that
follows, and the estimated peak memory that sized the configs' ``max_local_batch_size``.

    python bench/h100_model.py                   # markdown table
    python bench/h100_model.py --mfu 0.45 --kernel-tflops 120
    python bench/h100_model.py --fast-path       # predicted MFU and peak memory per config
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from kernel_accounting import issued  # noqa: E402

PEAK_BF16 = 989e12  # dense bf16 FLOP/s, H100 SXM
PEAK_HBM = 3.35e12  # bytes/s, H100 SXM
LAUNCH_S = 5e-6  # per kernel launch
LAUNCHES_PER_CALL = 6  # rows (x2), pairs forward, pairs backward, W U, the mean for l2_repel: all blocks at once
SPLIT_PAIR_COST = 3 * 2  # tf32x3: three dots, each at half the bf16 tensor-core rate
MEASURED_KERNEL_TFLOPS = 124.0  # this kernel at Qwen3-1.7B's shape on an H100 (docs/benchmarks.md, 2026-11-25)


class Config(NamedTuple):
    name: str
    layers: int
    dim: int
    mlp: int
    heads_dim: int  # query heads x head width
    kv_dim: int  # key-value heads x head width
    vocab: int
    seq_len: int
    micro_batch: int  # sequences per GPU per micro-batch (the config's max_local_batch_size)
    mlp_matrices: int  # 2 for GPT-2's MLP, 3 for SwiGLU
    global_batch: int = 64  # sequences per optimizer step
    rotary_qk_norm: bool = False  # Qwen3: normed and rotated copies of q and k are saved too


SHIPPED = [
    *(Config(f"gpt2_small_mlp{m}", 12, 768, m, 768, 768, 50304, 1024, 32, 2) for m in (768, 1536, 3072, 6144)),
    Config("midtrain_qwen3_0.6b", 28, 1024, 3072, 2048, 1024, 151936, 4096, 1, 3, rotary_qk_norm=True, global_batch=32),
    Config("midtrain_qwen3_1.7b", 28, 2048, 6144, 2048, 1024, 151936, 4096, 1, 3, rotary_qk_norm=True, global_batch=32),
]

# The fast-path roofline's assumptions (each an estimate, none measured here):
GEMM_EFFICIENCY = 0.70  # share of dense bf16 peak cuBLAS sustains at M >= 8k tokens, K, N >= 768
ATTENTION_FLOPS = 300e12  # SDPA flash forward + backward (FA2 class: 350 fwd / 260 bwd TFLOP/s at hd 128)
HBM_EFFICIENCY = 0.80  # share of peak bandwidth that fused elementwise kernels sustain
HEAD_BYTES_PER_VOCAB = 10  # bf16 logits written, read by the compiled loss, their gradient written and read
STATE_BYTES_PER_PARAM = 18  # fp32 weight, gradient and two AdamW moments, and the bf16 copy autocast casts


def model_flops(c: Config) -> float:
    """Training FLOPs of one micro-batch: 6 per weight per token (LM head included) plus attention."""
    per_layer = c.dim * (c.heads_dim + 2 * c.kv_dim) + c.heads_dim * c.dim + c.mlp_matrices * c.dim * c.mlp
    tokens = c.micro_batch * c.seq_len
    attention = 12 * c.layers * c.heads_dim * c.seq_len  # per token, as TorchTitan counts it
    return tokens * (6 * (c.layers * per_layer + c.vocab * c.dim) + attention)


def weights(c: Config) -> int:
    """Matmul weights, the (tied) LM head included; GPT-2's positions and the norms left out."""
    per_layer = c.dim * (c.heads_dim + 2 * c.kv_dim) + c.heads_dim * c.dim + c.mlp_matrices * c.dim * c.mlp
    return c.layers * per_layer + c.vocab * c.dim


def saved_bytes_per_token(c: Config) -> int:
    """Activation bytes one token keeps for backward in one block, under bf16 autocast: the
    fp32 residual stream at both norms and their bf16 outputs (12 d), the q k v projections,
    SDPA's q k v (k, v repeated to every head) and output, the MLP's hidden activations
    (GELU: 2 of width mlp, SwiGLU: 4), and for Qwen3 the normed and rotated q and k."""
    attention = 2 * (c.heads_dim + 2 * c.kv_dim) + 2 * 4 * c.heads_dim
    attention += 4 * (c.heads_dim + c.kv_dim) if c.rotary_qk_norm else 0
    return 12 * c.dim + attention + 2 * c.mlp * (2 if c.mlp_matrices == 2 else 4)


def peak_memory_bytes(c: Config) -> float:
    """Estimated peak memory of one GPU holding the whole model: optimizer state plus one
    micro-batch's saved activations plus its LM-head logits and their gradient."""
    tokens = c.micro_batch * c.seq_len
    return STATE_BYTES_PER_PARAM * weights(c) + tokens * (c.layers * saved_bytes_per_token(c) + 8 * c.vocab)


def fast_path_step(c: Config) -> dict[str, float]:
    """Seconds of one optimizer step (the config's global batch on one GPU) by term, and the MFU
    that follows: GEMMs at GEMM_EFFICIENCY of peak, causal attention (half its counted FLOPs
    issued) at ATTENTION_FLOPS, every saved activation written, read and its gradient written,
    the LM head's logits at HEAD_BYTES_PER_VOCAB, and fused AdamW reading and writing its state once."""
    tokens = c.global_batch * c.seq_len
    attention = 12 * c.layers * c.heads_dim * c.seq_len * tokens
    terms = {
        "gemm": 6 * weights(c) * tokens / (GEMM_EFFICIENCY * PEAK_BF16),
        "attention": attention / 2 / ATTENTION_FLOPS,
        "activations": 3 * c.layers * saved_bytes_per_token(c) * tokens / (HBM_EFFICIENCY * PEAK_HBM),
        "lm_head": HEAD_BYTES_PER_VOCAB * c.vocab * tokens / (HBM_EFFICIENCY * PEAK_HBM),
        "optimizer": 2 * 16 * weights(c) / (HBM_EFFICIENCY * PEAK_HBM),
    }
    terms["step"] = sum(terms.values())
    terms["mfu"] = model_flops(c) * c.global_batch / c.micro_batch / (terms["step"] * PEAK_BF16)
    return terms


def print_fast_path() -> None:
    print(
        f"PREDICTION (not a measurement): the model's step on the fast path, one H100 SXM; GEMMs at "
        f"{GEMM_EFFICIENCY:.0%} of {PEAK_BF16 / 1e12:.0f} TFLOP/s, attention at {ATTENTION_FLOPS / 1e12:.0f} "
        f"TFLOP/s, memory traffic at {HBM_EFFICIENCY:.0%} of {PEAK_HBM / 1e12:.2f} TB/s"
    )
    print(
        "| config | micro-batch × seq | est. peak GiB | GEMM ms | attention ms | activations ms | LM head ms | "
        "AdamW ms | step ms | tokens/s | MFU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in SHIPPED:
        t = fast_path_step(c)
        ms = " | ".join(
            f"{t[k] * 1e3:.1f}" for k in ("gemm", "attention", "activations", "lm_head", "optimizer", "step")
        )
        print(
            f"| {c.name} | {c.micro_batch} × {c.seq_len} | {peak_memory_bytes(c) / 2**30:.0f} | {ms} | "
            f"{c.global_batch * c.seq_len / t['step']:,.0f} | {t['mfu']:.0%} |"
        )


def loss_seconds(c: Config, kernel_flops_per_s: float, pair_cost: int = 1) -> tuple[float, float]:
    """(seconds, FLOPs of the products) of the loss on every block of one micro-batch; ``pair_cost``:
    the pair products' time in bf16 products (SPLIT_PAIR_COST for perplexity_entropy)."""
    work = issued(c.micro_batch * c.layers, c.seq_len, c.dim)
    per_unit = c.layers * c.micro_batch * c.seq_len**2 * c.dim
    flops = work["product_flops"] * per_unit
    dz = issued(c.micro_batch * c.layers, c.seq_len, c.dim, pair_dots=0)["matmul_flops"] * per_unit
    bf16_equivalent = dz + (flops - dz) * pair_cost
    traffic = c.layers * work["glue_traffic"] * c.micro_batch * c.seq_len * c.dim * 4
    kernel_traffic = c.layers * c.micro_batch * c.seq_len * (c.seq_len * 2 * 2 + c.dim * 2 * 8)  # W twice, rows
    batching = 2 * 2 * c.layers * c.micro_batch * c.seq_len * c.dim * 2  # the blocks copied in and their grads out
    seconds = (
        bf16_equivalent / kernel_flops_per_s
        + (traffic + kernel_traffic + batching) / PEAK_HBM
        + LAUNCHES_PER_CALL * LAUNCH_S
    )
    return seconds, flops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mfu", type=float, default=0.40, help="assumed MFU of the model's own step")
    p.add_argument(
        "--kernel-tflops",
        type=float,
        default=MEASURED_KERNEL_TFLOPS,
        help="sustained rate of the loss kernels (default: measured on an H100)",
    )
    p.add_argument("--fast-path", action="store_true", help="the model's own step and memory instead (see above)")
    args = p.parse_args()
    if args.fast_path:
        print_fast_path()
        return
    print(f"PREDICTION (not a measurement): H100 SXM peaks {PEAK_BF16 / 1e12:.0f} TFLOP/s bf16, "
          f"{PEAK_HBM / 1e12:.2f} TB/s; model at MFU {args.mfu:.2f}; loss kernels at {args.kernel_tflops:.0f} "
          f"TFLOP/s sustained, and at 50% of peak")  # fmt: skip
    print(
        "| config | variant | micro-batch × seq | model step ms | loss FLOPs (÷ B·N²·d per block) | loss ms | "
        "ratio | ratio at 50% peak |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c in SHIPPED:
        step = model_flops(c) / (args.mfu * PEAK_BF16)
        for variant, pair_cost in (("angular_spread", 1), ("perplexity_entropy", SPLIT_PAIR_COST)):
            loss, flops = loss_seconds(c, args.kernel_tflops * 1e12, pair_cost)
            fast, _ = loss_seconds(c, 0.5 * PEAK_BF16, pair_cost)
            units = flops / (c.layers * c.micro_batch * c.seq_len**2 * c.dim)
            print(
                f"| {c.name} | {variant} | {c.micro_batch} × {c.seq_len} | {step * 1e3:.1f} | {flops / 1e12:.2f} T "
                f"({units:.2f}) | {loss * 1e3:.1f} | {(step + loss) / step:.3f} | {(step + fast) / step:.3f} |"
            )


if __name__ == "__main__":
    main()
