"""The GPUs a plan is made for (NVIDIA's data sheets: SXM, dense bf16) and the GPU steps measured in
``docs/benchmarks.md`` that calibrate its roofline (measured / roofline of the same step; a GPU
without one gets the roofline alone, labelled a prediction)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float
    """Memory as NVIDIA sells it, in GB (10^9 bytes): what a plan's peak must stay under."""
    bf16_flops: float
    """Dense bf16 (and fp16) tensor-core FLOP/s."""
    fp32_flops: float
    """Dense fp32 FLOP/s without tensor cores (fp32 matmuls and elementwise math)."""
    hbm_bytes_per_s: float
    node_link_bytes_per_s: float
    """NVLink bandwidth one GPU sends at inside a node, one direction."""
    network_bytes_per_s: float
    """InfiniBand bandwidth per GPU between nodes (one NIC per GPU), one direction."""
    gpus_per_node: int = 8


GPUS = {
    "h100": GPU("H100 SXM 80GB", 80, 989e12, 67e12, 3.35e12, 450e9, 50e9),
    "h200": GPU("H200 SXM 141GB", 141, 989e12, 67e12, 4.8e12, 450e9, 50e9),
    "a100": GPU("A100 SXM 80GB", 80, 312e12, 19.5e12, 2.039e12, 300e9, 25e9),
}
"""NDR InfiniBand (400 Gb/s) per H100/H200, HDR (200 Gb/s) per A100."""


def counted(n: int, one: str, many: str = "") -> str:
    """``n`` and its noun, singular for 1: a plan's counts may be 1 (one GPU, one sequence per micro-batch)."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


@dataclass(frozen=True)
class MeasuredStep:
    measured_s: float
    roofline_s: float
    """``plan``'s roofline of the same step (``bench/plan_accuracy.py``)."""
    measured_on: str
    """The card and the date, as a plan names them (a wheel has no docs/)."""


GPT2_SHIPPED = ("train_configs/gpt2_small_mlp3072.toml", "--parallelism.data_parallel_shard_degree", "1")
"""The step ``bench/gpu_acceptance.sh`` timed: GPT-2 small as shipped, CE only, on one GPU."""
MEASURED_WHAT = "GPT-2 small as shipped, 64 × 1024 tokens, CE only"
MEASURED_STEPS = {  # ``GPUS`` key: its measured step of GPT2_SHIPPED (MEASURED_WHAT)
    # the H100's roofline: that step's code now, q, k, v one GEMM (issue 48; measured with three)
    "h100": MeasuredStep(139.4e-3, 126.07e-3, "an H100, 2026-11-26"),
    "h200": MeasuredStep(130.6e-3, 98.92e-3, "an H200, 2026-11-26"),
}


TERM_STEP = (2 * 32 * 12, 1024, 768)
"""The dispersion term in GPT-2 small's shipped step: rows (2 micro-batches × 32 sequences × 12 blocks),
tokens and width."""
TERM_STEPS_H200 = {  # each variant's step in the run of MEASURED_STEPS' H200 CE step (docs/benchmarks.md)
    "angular_spread": 147.4e-3,
    "orthogonalization": 149.8e-3,
    "l2_repel": 148.0e-3,
    "decorrelation": 148.2e-3,
    "perplexity_entropy": 210.8e-3,
}
TERM_LABEL = (
    "its dispersion term at the FLOP rate its kernels reached in GPT-2 small's step on an H200 "
    "(measured 2026-11-26), scaled by the GPU's bf16 peak: a prediction"
)


def term_floor_flops(rows: int, tokens: int, width: int) -> float:
    """The exact term's FLOP floor, forward and backward: 4·rows·N²·d."""
    return 4.0 * rows * tokens**2 * width


def term_seconds(variant: str, rows: int, tokens: int, width: int, bf16_flops: float) -> float:
    """Seconds of the fused kernels over ``rows`` × ``tokens`` × ``width`` at ``variant``'s measured
    rate, scaled to a GPU of ``bf16_flops``."""
    measured = TERM_STEPS_H200[variant] - MEASURED_STEPS["h200"].measured_s  # the variant's step less CE only's
    rate = term_floor_flops(*TERM_STEP) / measured * bf16_flops / GPUS["h200"].bf16_flops
    return term_floor_flops(rows, tokens, width) / rate


@dataclass(frozen=True)
class Calibration:
    factor: float
    label: str


def calibration(gpu: str) -> Calibration:
    """The factor on the roofline for ``gpu``, and what it rests on."""
    if figure := MEASURED_STEPS.get(gpu):
        factor = figure.measured_s / figure.roofline_s
        return Calibration(
            factor,
            f"roofline × {factor:.2f}, calibrated on the measured {MEASURED_WHAT} "
            f"({figure.measured_s * 1e3:.1f} ms on {figure.measured_on})",
        )
    return Calibration(1.0, f"roofline, uncalibrated: a prediction (no {gpu.upper()} step measured yet)")
