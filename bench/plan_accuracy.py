"""Which cost model predicts the measured GPU steps better: ``plan``'s roofline (PyTorch's
``RuntimeEstimator`` roofline of the trainer's own step, ``dispersion_titan.planning.step_measure.Roofline``)
or the hand-written ``bench/h100_model.py`` (its fast-path terms, and its model step at an
assumed MFU plus its loss-kernel terms). Each against the GPU steps measured in
docs/benchmarks.md (GPT-2 small as shipped: 64 × 1024 tokens, bf16, compiled), uncalibrated and calibrated
on the CE-only step of the same GPU (as ``plan`` calibrates; its dispersion term priced apart, at the
kernels' rate measured in that step, ``planning.figures.term_seconds``). Prints the roofline values that
``dispersion_titan/planning/figures.py`` stores. CPU only, about a minute.

    python bench/plan_accuracy.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parent),
    str(Path(__file__).resolve().parents[1] / "tests"),
]

import h100_model  # noqa: E402

from dispersion_titan.plan import plan_args  # noqa: E402
from dispersion_titan.planning.figures import GPT2_SHIPPED  # noqa: E402
from dispersion_titan.planning.resource_plan import planned  # noqa: E402

STEPS = [  # (GPU, variant, measured ms, docs/benchmarks.md row)
    ("h100", "none", 139.4, "GPT-2 small as shipped, CE only (H100, 2026-11-26)"),
    ("h200", "none", 130.6, "GPT-2 small as shipped, step ratio per variant (H200, 2026-11-26)"),
    ("h200", "angular_spread", 147.4, "same row"),
    ("h200", "l2_repel", 148.0, "same row"),
    ("h200", "perplexity_entropy", 210.8, "same row"),
]
(SHAPE,) = (c for c in h100_model.SHIPPED if c.name == "gpt2_small_mlp3072")


def plan_ms(gpu: str, variant: str) -> tuple[float, float, float]:
    """The plan of the step: its roofline (uncalibrated), its dispersion term at the kernels'
    measured rate, and the compute time it prints (the roofline calibrated, plus the term)."""
    coeff = "0.1" if variant != "none" else "0"
    overrides = (*GPT2_SHIPPED[1:], "--dispersion.variant", variant, "--dispersion.coeff", coeff)
    plan = planned(variant, plan_args(GPT2_SHIPPED[0], None, overrides), 1, None, gpu)
    accumulation = plan.layout.accumulation
    roofline = accumulation * plan.step.micro_batch_s + plan.step.optimizer_s
    return roofline * 1e3, accumulation * plan.step.term_s * 1e3, plan.time.compute_s * 1e3


def hand_ms(variant: str) -> tuple[float, float]:
    """bench/h100_model.py's step of SHAPE (H100 only): its fast-path terms, and its model step at
    its default MFU; each plus its loss-kernel terms for a dispersion variant."""
    accumulation = SHAPE.global_batch // SHAPE.micro_batch  # model_flops and loss_seconds: one micro-batch
    loss = 0.0
    if variant != "none":
        cost = h100_model.SPLIT_PAIR_COST if variant == "perplexity_entropy" else 1
        loss = accumulation * h100_model.loss_seconds(SHAPE, h100_model.MEASURED_KERNEL_TFLOPS * 1e12, cost)[0]
    fast = h100_model.fast_path_step(SHAPE)["step"] + loss
    mfu = accumulation * h100_model.model_flops(SHAPE) / (0.40 * h100_model.PEAK_BF16) + loss
    return fast * 1e3, mfu * 1e3


def _cell(pred: float | None, measured: float, factor: float = 1.0) -> str:
    return "—" if pred is None else f"{pred * factor:.1f} ({(pred * factor - measured) / measured:+.1%})"


def main() -> None:
    rows = []
    for gpu, variant, measured, _source in STEPS:
        fast, mfu = hand_ms(variant) if gpu == "h100" else (None, None)
        rows.append((gpu, variant, measured, *plan_ms(gpu, variant), fast, mfu))
    ce = {row[0]: row for row in rows if row[1] == "none"}  # each GPU's calibration step
    print(
        "| GPU | variant | measured ms | roofline + term ms | plan ms | h100_model fast path ms | "
        "h100_model MFU 0.40 ms | fast path, calibrated | MFU 0.40, calibrated |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for gpu, variant, measured, roofline, term, plan, fast, mfu in rows:
        factors = [ce[gpu][2] / p if p else 1.0 for p in ce[gpu][6:]]
        hand = [fast, mfu]
        cells = [_cell(roofline + term, measured), _cell(plan, measured), *(_cell(p, measured) for p in hand)]
        cells += [_cell(p, measured, f) for p, f in zip(hand, factors, strict=True)]
        print(f"| {gpu.upper()} | {variant} | {measured} | {' | '.join(cells)} |")
    for gpu, row in ce.items():
        print(f"figures.py roofline_s for {gpu}: {row[3] / 1e3:.5g}")


if __name__ == "__main__":
    main()
