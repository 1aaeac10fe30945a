"""``analyze RUN --wandb``: what the analysis writes to TensorBoard, its summary and figures, into the
training run's W&B run."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..components import wandb_run
from .result_files import read_results


def log_analysis(dump_folder: str, out: str) -> None:
    import wandb

    per_step: dict[int, dict[str, Any]] = {}
    for step, result in read_results(out).items():
        edges = np.linspace(*result.hist_range, result.hist_bins + 1)
        per_step[step] = {}
        for layer in result.layers:
            per_step[step][f"cosine/{layer.name}"] = wandb.Histogram(np_histogram=(layer.hist, edges))
            per_step[step][f"mean_cos/{layer.name}"] = layer.mean_cos
    wandb_run.log_results(dump_folder, "analyze", "analysis", per_step, out)
