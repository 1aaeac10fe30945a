"""Each layer's cosine distribution as a TensorBoard histogram at the checkpoint's step,
in the run's TensorBoard folder, so condensation sits beside the training curves."""

from __future__ import annotations

import numpy as np
import torch

from .statistics import HIST_BINS, HIST_RANGE

EDGES = np.linspace(*HIST_RANGE, HIST_BINS + 1)


class CondensationWriter:
    """Opens its event file on first use, so a run with nothing new to analyze writes none."""

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self._writer = None

    def add_step(self, step: int, names: list[str], means: torch.Tensor, mean_cos: list[float]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=self.log_dir)
        for name, matrix, value in zip(names, means.cpu().numpy(), mean_cos):
            self._writer.add_histogram(f"analysis/cosine/{name}", matrix.clip(*HIST_RANGE), step, bins=EDGES)
            self._writer.add_scalar(f"analysis/mean_cos/{name}", value, step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
