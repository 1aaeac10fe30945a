"""W&B carries what TensorBoard gets: a real training run with ``[metrics] enable_wandb``,
offline (``WANDB_MODE=offline``), read back from its run files."""

from __future__ import annotations

import json

import pytest

from dispersion_titan.components.metrics import WANDB_RUN_FILE
from support.launch import torchrun
from support.runs import scalars
from support.wandb_files import history, run_ids


def test_wandb_gets_every_scalar_tensorboard_gets(tmp_path):
    dump = tmp_path / "run"
    torchrun(dump, 1, "--training.steps", "2", "--checkpoint.no-enable", "--validation.freq", "2",
             "--validation.steps", "1", "--dispersion.variant", "angular_spread", "--dispersion.coeff", "0.3",
             "--dispersion.max_tokens", "64", "--metrics.enable_wandb",
             env={"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_PROJECT": "dispersion-test"})
    board, wandb = scalars(dump), history(dump)
    for tag in ("loss_metrics/dispersion", "condensation/block_2_mean_cos_offdiag", "validation_metrics/loss",
                "validation_metrics/perplexity"):
        assert tag in board, sorted(board)
    assert wandb.keys() == board.keys()
    for tag, by_step in board.items():
        assert wandb[tag] == pytest.approx(by_step, rel=1e-6), tag  # TensorBoard keeps float32
    recorded = json.loads((dump / WANDB_RUN_FILE).read_text())
    assert [recorded["id"]] == run_ids(dump) and recorded["project"] == "dispersion-test"
