"""A run resumed from a checkpoint continues exactly like the uninterrupted run:
model, optimizer, LR schedule, data position and dispersion token subsets; also on
another number of data-parallel ranks, and a finished run relaunched does nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispersion_titan.run_folder.checkpoints import check_resume
from dispersion_titan.utils.errors import CheckpointError
from support.launch import REFERENCE_STEPS, SCHEDULE, torchrun
from support.runs import digests, load_weights, max_abs_diff, scalars

pytestmark = pytest.mark.slow

# The reference run's schedule (conftest's ``reference_run``: 2 processes, 8 steps), with
# validation every 2 steps; a launch to step 4 ends with a full checkpoint, so raising
# training.steps resumes from it (a weights-only one would be refused: test_run_ledger.py).
ELASTIC = (*SCHEDULE, "--validation.freq", "2", "--checkpoint.no-last_save_model_only")
TAGS = ("loss_metrics/global_avg_loss", "loss_metrics/ce", "loss_metrics/dispersion", "grad_norm")
LOSS, VALIDATION = "loss_metrics/global_avg_loss", "validation_metrics/loss"
STOP, RESUMED = 4, 6  # resumed to step 6 of the reference's 8: two steps show it continues exactly


@pytest.fixture(scope="module")
def elastic(tmp_path_factory, reference_run) -> dict[str, Path]:
    """The session's uninterrupted run (the yardstick), and a 2-process and a 1-process run
    stopped at step 4 (final checkpoint: full), plus an untouched
    copy of the 2-process one."""
    root = tmp_path_factory.mktemp("elastic")
    torchrun(root / "two", 2, "--training.steps", str(STOP), *ELASTIC)
    torchrun(root / "one", 1, "--training.steps", str(STOP), *ELASTIC)
    shutil.copytree(root / "two", root / "two_again")
    return {"straight": reference_run, **{name: root / name for name in ("two", "one", "two_again")}}


def test_resumed_run_reproduces_uninterrupted_losses(elastic):
    """The same layout, raised training.steps: bit for bit the uninterrupted run (model,
    optimizer, LR schedule, data position and dispersion token subsets)."""
    dump = elastic["two_again"]
    second = torchrun(dump, 2, "--training.steps", str(RESUMED), *ELASTIC)
    assert f"Training starts at step {STOP + 1}" in second.stdout + second.stderr
    want, got = scalars(elastic["straight"]), scalars(dump)
    for tag in TAGS:
        assert sorted(got[tag]) == list(range(1, RESUMED + 1)), tag
        for step in got[tag]:
            assert got[tag][step] == want[tag][step], (tag, step)
    assert (
        max_abs_diff(
            load_weights(dump / "checkpoint" / f"step-{RESUMED}"),
            load_weights(elastic["straight"] / "checkpoint" / f"step-{RESUMED}"),
        )
        == 0.0
    )


def test_finished_run_relaunched_does_nothing(elastic):
    """The same command again: one line, exit 0, every byte of the run folder unchanged."""
    before = digests(elastic["two"])
    again = torchrun(elastic["two"], 2, "--training.steps", str(STOP), *ELASTIC)
    assert f"dispersion_titan: run already finished at step {STOP}; nothing to do" in again.stderr
    assert "Training starts" not in again.stdout + again.stderr
    assert digests(elastic["two"]) == before


def test_model_only_run_cannot_continue_and_says_why(elastic, tmp_path):
    """Only a weights-only checkpoint (the reference run's final one): no training state to
    continue from, one line."""
    final = f"step-{REFERENCE_STEPS}"
    shutil.copytree(elastic["straight"] / "checkpoint" / final, tmp_path / "checkpoint" / final)
    shutil.copy(elastic["straight"] / "run.json", tmp_path)  # a run's checkpoints come with its run.json
    with pytest.raises(
        CheckpointError,
        match=rf"{final} holds weights only .* cannot continue to step 10; "
        rf"start a new job.dump_folder from its weights with "
        rf"--job.fork_from {tmp_path}@8",
    ):
        check_resume(str(tmp_path / "checkpoint"), str(tmp_path), 10, 1)


def test_validation_loss_does_not_depend_on_the_layout(elastic):
    """validation.steps counts global batches: 1 and 2 processes validate on the same
    sequences (the weights agree to float rounding)."""
    one, two = scalars(elastic["one"])[VALIDATION], scalars(elastic["two"])[VALIDATION]
    assert sorted(one) == sorted(two) == [1, 2, 4]
    for step in (1, 2, 4):
        assert one[step] == pytest.approx(two[step], rel=1e-5), step


@pytest.mark.parametrize("saved_by, resumed_by", [("two", 1), ("one", 2)], ids=["2->1", "1->2"])
def test_resume_under_another_data_parallel_degree(elastic, saved_by, resumed_by):
    """Raised training.steps on another number of processes: it resumes from step 4 and
    trains as the uninterrupted run."""
    dump = elastic[saved_by]
    resumed = torchrun(dump, resumed_by, "--training.steps", str(RESUMED), *ELASTIC)
    assert f"Training starts at step {STOP + 1}" in resumed.stdout + resumed.stderr
    want, got = scalars(elastic["straight"])[LOSS], scalars(dump)[LOSS]
    assert max(got) == RESUMED
    for step in range(STOP + 1, RESUMED + 1):
        assert got[step] == pytest.approx(want[step], rel=1e-4), step
