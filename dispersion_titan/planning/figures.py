"""The GPU steps measured in ``docs/benchmarks.md`` that a plan's time is calibrated on.

Each figure is a step time measured on one GPU, with the arguments that make the same step of
a shipped config and the roofline ``plan`` gives that step (``bench/plan_accuracy.py`` prints
it; ``tests/test_plan.py`` recomputes it and finds the figure in docs/benchmarks.md). A plan on
a GPU with a figure scales its roofline compute by measured / roofline of that GPU's figure and
says so; on a GPU without one it is the roofline alone, labelled a prediction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MeasuredStep:
    gpu: str
    """``planning.gpus.GPUS`` key."""
    what: str
    measured_s: float
    roofline_s: float
    """``plan``'s roofline of the same step (``bench/plan_accuracy.py``)."""
    args: tuple[str, ...]
    """The config and overrides of the same step (one GPU, one micro-batch)."""
    source: str
    """Where ``docs/benchmarks.md`` has it."""


GPT2_8X1024 = (
    "train_configs/gpt2_small_mlp3072.toml",
    "--model.vocab_size",
    "50257",
    "--training.global_batch_size",
    "8",
    "--training.max_local_batch_size",
    "8",
    "--optimizer.implementation",
    "foreach",
)
"""The step ``bench/train_step.py`` timed in 2026-11: GPT-2 small (MLP 3072, raw vocabulary), 8 × 1024 tokens, bf16."""

MEASURED_STEPS = (
    MeasuredStep(
        "h100",
        "GPT-2 small, 8 × 1024 tokens, bf16, compiled, CE only",
        52.7e-3,
        17.347e-3,
        GPT2_8X1024,
        "docs/benchmarks.md: step ratio, GPT-2 small (H100, 2026-11-25): 52.7 ms",
    ),
    MeasuredStep(
        "h200",
        "GPT-2 small, 8 × 1024 tokens, bf16, compiled, CE only",
        47.9e-3,
        13.365e-3,
        GPT2_8X1024,
        "docs/benchmarks.md: step ratio at the released form's default (H200, 2026-11-25): 47.9 ms",
    ),
)


@dataclass(frozen=True)
class Calibration:
    factor: float
    label: str


def calibration(gpu: str) -> Calibration:
    """The factor on the roofline for ``gpu``, and what it rests on."""
    for figure in MEASURED_STEPS:
        if figure.gpu == gpu:
            factor = figure.measured_s / figure.roofline_s
            return Calibration(
                factor,
                f"roofline × {factor:.2f}, calibrated on the measured {figure.what} "
                f"({figure.measured_s * 1e3:.1f} ms, {figure.source.split(': ', 1)[0]})",
            )
    return Calibration(1.0, f"roofline, uncalibrated: a prediction (no {gpu.upper()} step measured yet)")
