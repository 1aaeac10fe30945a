"""``analyze RUN --wandb``: the analysis into the training run's W&B run. Each checkpoint's
per-layer cosine histogram and ``mean_cos`` (what the analysis writes to TensorBoard) against
``checkpoint_step``, then the summary table and the figures."""

from __future__ import annotations

import numpy as np

from ..components import wandb_run
from .result_files import read_results


def log_analysis(dump_folder: str, out: str) -> None:
    import wandb

    run = wandb_run.resume(dump_folder, "analyze")
    try:
        # A resumed run's own step is past training's last one: analysis steps get their own axis.
        run.define_metric("checkpoint_step")
        for measure in ("cosine", "mean_cos"):
            run.define_metric(f"analysis/{measure}/*", step_metric="checkpoint_step")
        for step, result in read_results(out).items():
            edges = np.linspace(*result.hist_range, result.hist_bins + 1)
            logged = {"checkpoint_step": step}
            for layer in result.layers:
                logged[f"analysis/cosine/{layer.name}"] = wandb.Histogram(np_histogram=(layer.hist, edges))
                logged[f"analysis/mean_cos/{layer.name}"] = layer.mean_cos
            run.log(logged)
        wandb_run.files(run, out, "analysis")
    finally:
        run.finish()
