"""``evaluate RUN --wandb``: each checkpoint's scores (``summary.csv``'s row) into the training
run's W&B run, then the summary table."""

from __future__ import annotations

import csv
import os

from ..components import wandb_run
from .step_results import SUMMARY_FILE


def log_evaluation(dump_folder: str, out: str) -> None:
    with open(os.path.join(out, SUMMARY_FILE), newline="") as f:
        rows = list(csv.DictReader(f))
    per_step = {
        int(row.pop("step")): {name: float(value) for name, value in row.items() if value != ""} for row in rows
    }
    wandb_run.log_results(dump_folder, "evaluate", "evaluation", per_step, out)
