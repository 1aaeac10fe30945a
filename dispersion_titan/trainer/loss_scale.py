"""``training.loss_scale``: what one micro-batch backpropagates.

``mean`` (ours): its cross-entropy summed over its tokens / the global batch's tokens, plus the
dispersion term weighted b/G (``objective``): summed over micro-batches and data-parallel ranks,
the gradient of the global batch's mean loss, whatever the layout.

``as_released`` (the authors' runs): its own mean, cross-entropy over its tokens plus λ·its
dispersion term, summed over a rank's micro-batches and averaged over data-parallel ranks. That is
what transformers' Trainer backpropagates with the authors' ``compute_loss``, which returns the
micro-batch's mean and ignores ``num_items_in_batch``, for a model whose ``forward`` takes
``**kwargs`` (GPT-2, Qwen3), in every release from 4.46.0 (read from each one's ``training_step``):
4.46.x multiply the loss by the accumulation count and accelerate's ``backward`` divides it again;
from 4.47.0 accelerate no longer divides, and the Trainer divides only when it counted no
``num_items_in_batch`` (4.48) or the model takes no ``**kwargs`` (4.47 never; 4.49 on, 5.x too).
Its gradient before clipping is the accumulation count A times the mean's. A is the authors'
(``[released]``'s ``gradient_accumulation_steps``: 4 GPT-2, 32 Qwen3, 8 Fig. 3, whatever layout
trains their run), else the run's own micro-batches per rank.
"""

from __future__ import annotations

import torch
from torchtitan.components.loss import IGNORE_INDEX


def released_scales(
    labels: torch.Tensor, dp_degree: int, global_batch: int, accumulation: int
) -> tuple[torch.Tensor, float]:
    """``as_released`` for one micro-batch of ``labels`` on one of ``dp_degree`` ranks whose gradients are
    summed, with m = G / (b × ranks) micro-batches per rank standing for the authors' ``accumulation`` A:
    (the denominator of its cross-entropy sum: its scored tokens × ranks × m / A, counted on the device;
    the factor on the b/G-weighted dispersion term: A). Summed, A × the mean's gradient."""
    microbatches = global_batch / (labels.shape[0] * dp_degree)
    tokens = (labels != IGNORE_INDEX).sum() * (dp_degree * microbatches / accumulation)
    return tokens, float(accumulation)
