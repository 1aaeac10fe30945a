"""``training.loss_scale = "as_released"``: each micro-batch backpropagates its own mean (CE plus
λ·term), summed over a rank's micro-batches and averaged over ranks, as transformers' Trainer does
with the authors' ``compute_loss`` (it ignores ``num_items_in_batch``; every release from 4.46.0,
read from each ``training_step``): A times the mean's gradient, A the authors' accumulation count
(``released.gradient_accumulation_steps``), else the run's micro-batches per rank. ``mean`` needs
nothing here (``objective``).
"""

from __future__ import annotations

import torch
from torchtitan.components.loss import IGNORE_INDEX


def released_scales(
    labels: torch.Tensor, dp_degree: int, global_batch: int, accumulation: int
) -> tuple[torch.Tensor, float]:
    """For one micro-batch of ``labels`` on one of ``dp_degree`` summed ranks, m = G / (b × ranks)
    micro-batches standing for A = ``accumulation``: (its CE sum's denominator, scored tokens × ranks
    × m / A, on the device; the factor A on the b/G-weighted term)."""
    microbatches = global_batch / (labels.shape[0] * dp_degree)
    tokens = (labels != IGNORE_INDEX).sum() * (dp_degree * microbatches / accumulation)
    return tokens, float(accumulation)
