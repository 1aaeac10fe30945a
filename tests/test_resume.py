"""A run resumed from a checkpoint continues exactly like the uninterrupted run:
model, optimizer, LR schedule, data position and dispersion token subsets."""

from __future__ import annotations

import pytest

from helpers import load_weights, max_abs_diff, scalars, torchrun

pytestmark = pytest.mark.slow

COMMON = (
    "--lr_scheduler.total_steps", "6", "--checkpoint.interval", "3", "--validation.no-enable",
    "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.3", "--dispersion.max_tokens", "64",
)
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion", "grad_norm")


def test_resumed_run_reproduces_uninterrupted_losses(tmp_path):
    torchrun(tmp_path / "straight", 2, "--training.steps", "6", *COMMON)
    resumed = tmp_path / "resumed"
    torchrun(resumed, 2, "--training.steps", "3", "--checkpoint.no-last-save-model-only", *COMMON)
    assert (resumed / "checkpoint" / "step-3").is_dir()
    second = torchrun(resumed, 2, "--training.steps", "6", *COMMON)
    assert "Training starts at step 4" in second.stdout + second.stderr

    want, got = scalars(tmp_path / "straight"), scalars(resumed)
    for tag in TAGS:
        for step in range(1, 7):
            assert got[tag][step] == want[tag][step], (tag, step)
    assert max_abs_diff(load_weights(resumed / "checkpoint" / "step-6"),
                        load_weights(tmp_path / "straight" / "checkpoint" / "step-6")) == 0.0
