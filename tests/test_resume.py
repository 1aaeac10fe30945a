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


def test_resume_with_another_data_parallel_degree_is_refused_in_one_line(tmp_path):
    """TorchTitan keeps the loader state per DP rank: a 2-rank checkpoint cannot resume on
    1 rank. The refusal is one line naming both degrees, and the checkpoint is untouched."""
    torchrun(tmp_path, 2, "--training.steps", "2", "--validation.no-enable", "--checkpoint.no-last-save-model-only")
    step = tmp_path / "checkpoint" / "step-2"
    before = {p.name: p.read_bytes() for p in step.iterdir()}
    proc = torchrun(tmp_path, 1, "--training.steps", "4", "--validation.no-enable", check=False)
    assert proc.returncode != 0
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if "dispersion_titan: error:" in line]
    assert errors and errors[0].split("dispersion_titan: error: ", 1)[1].startswith(
        f"parallelism: {step} was saved by 2 data-parallel ranks and this run has 1"
    )
    assert {p.name: p.read_bytes() for p in step.iterdir()} == before
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-0", "step-2"]
