"""A run resumed from a checkpoint continues exactly like the uninterrupted run:
model, optimizer, LR schedule, data position and dispersion token subsets; also on
another number of data-parallel ranks, and a finished run relaunched does nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispersion_titan.errors import CheckpointError
from dispersion_titan.trainer.checkpoints import plan_resume
from helpers import digests, load_weights, max_abs_diff, scalars, torchrun

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


# ---------------------------------------------------------------- elastic and idempotent relaunches

ELASTIC = ("--lr_scheduler.total_steps", "12", "--checkpoint.interval", "4", "--validation.freq", "4",
           "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.3", "--dispersion.max_tokens", "64")
LOSS, VALIDATION = "loss_metrics/global_avg_loss", "validation_metrics/loss"


@pytest.fixture(scope="module")
def elastic(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted 2-process run to step 12 (the yardstick), a 2-process and a
    1-process run to step 8 (final checkpoint: weights only, as by default)."""
    root = tmp_path_factory.mktemp("elastic")
    torchrun(root / "straight", 2, "--training.steps", "12", *ELASTIC)
    torchrun(root / "two", 2, "--training.steps", "8", *ELASTIC)
    torchrun(root / "one", 1, "--training.steps", "8", *ELASTIC)
    return {name: root / name for name in ("straight", "two", "one")}


def test_finished_run_relaunched_does_nothing(elastic):
    """The same command again: one line, exit 0, every byte of the run folder unchanged."""
    before = digests(elastic["two"])
    again = torchrun(elastic["two"], 2, "--training.steps", "8", *ELASTIC)
    assert "dispersion_titan: run already finished at step 8; nothing to do" in again.stderr
    assert "Training starts" not in again.stdout + again.stderr
    assert digests(elastic["two"]) == before


def test_model_only_run_cannot_continue_and_says_why(elastic, tmp_path):
    """Only a weights-only checkpoint: no training state to continue from, one line."""
    shutil.copytree(elastic["two"] / "checkpoint" / "step-8", tmp_path / "checkpoint" / "step-8")
    with pytest.raises(CheckpointError, match=r"step-8 holds weights only .* cannot continue to step 12; start a new "
                                              r"job.dump_folder from its weights with --checkpoint.initial_load_path"):
        plan_resume(str(tmp_path / "checkpoint"), 12, 1)


def test_validation_loss_does_not_depend_on_the_layout(elastic):
    """validation.steps counts global batches: 1 and 2 processes validate on the same
    sequences (the weights agree to float rounding)."""
    one, two = scalars(elastic["one"])[VALIDATION], scalars(elastic["two"])[VALIDATION]
    for step in (1, 4, 8):
        assert one[step] == pytest.approx(two[step], rel=1e-5), step


@pytest.mark.parametrize("saved_by, resumed_by", [("two", 1), ("one", 2)], ids=["2->1", "1->2"])
def test_resume_under_another_data_parallel_degree(elastic, saved_by, resumed_by):
    """Raised training.steps on another number of processes: it resumes from the last full
    checkpoint (step 4; step 8 holds weights only) and trains as the uninterrupted run."""
    dump = elastic[saved_by]
    resumed = torchrun(dump, resumed_by, "--training.steps", "12", *ELASTIC)
    assert "resuming from step 4, the last full checkpoint (step-8 holds weights only)" in resumed.stderr
    assert "Training starts at step 5" in resumed.stdout + resumed.stderr
    want, got = scalars(elastic["straight"])[LOSS], scalars(dump)[LOSS]
    for step in range(5, 13):
        assert got[step] == pytest.approx(want[step], rel=1e-4), step
