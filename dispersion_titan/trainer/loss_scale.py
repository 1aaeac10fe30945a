"""``training.loss_scale``: what one micro-batch backpropagates.

``mean`` (ours): its cross-entropy summed over its tokens / the global batch's tokens, plus the
dispersion term weighted b/G (``objective``): summed over micro-batches and data-parallel ranks,
the gradient of the global batch's mean loss, whatever the layout.

``as_released`` (the authors' runs): its own mean, cross-entropy over its tokens plus λ·its
dispersion term, summed over a rank's micro-batches and averaged over data-parallel ranks. That is
what transformers' Trainer backpropagates with the authors' ``compute_loss``, which returns the
micro-batch's mean and ignores ``num_items_in_batch``, for a model whose ``forward`` takes
``**kwargs`` (GPT-2, Qwen3): 4.46.0's ``training_step`` multiplies the loss by the accumulation
count and accelerate's ``backward`` divides it again; from 4.51.0 the division is skipped for such
models. Its gradient before clipping is the accumulation count times the mean's.
"""

from __future__ import annotations

import torch
from torchtitan.components.loss import IGNORE_INDEX


def released_scales(labels: torch.Tensor, dp_degree: int, global_batch: int) -> tuple[torch.Tensor, float]:
    """``as_released`` for one micro-batch of ``labels`` on one of ``dp_degree`` ranks whose gradients
    are summed: (the denominator of its cross-entropy sum: its scored tokens × ranks, counted on the
    device; the factor on the b/G-weighted dispersion term: G / (b × ranks))."""
    tokens = (labels != IGNORE_INDEX).sum() * dp_degree
    return tokens, global_batch / (labels.shape[0] * dp_degree)
