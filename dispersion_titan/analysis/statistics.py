"""The paper's condensation numbers from the per-layer averaged cosine matrices."""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import stats

from .inputs import Sequences

from .result import Condensation, LastN, LayerCondensation

HIST_BINS = 128
HIST_RANGE = (-1.0, 1.0)


def layer_fraction(index: int, num_layers: int) -> float:
    """Position of a layer in depth: 0 for the embedding, 1 for the final norm."""
    return index / (num_layers - 1)


def _finite_or_none(value: float) -> float | None:
    """JSON has no NaN: a constant curve has no rank correlation."""
    return None if math.isnan(value) else float(value)


def layer_statistics(names: list[str], means: torch.Tensor) -> list[LayerCondensation]:
    """Per layer: mean cosine over all S² entries (diagonal included), over the
    off-diagonal ones, and the 128-bin density histogram of all S² entries on [-1, 1]."""
    seq_len = means.shape[-1]
    layers = []
    for index, (name, matrix) in enumerate(zip(names, means.double().cpu().numpy())):
        total, trace = matrix.sum(), np.trace(matrix)
        density, _ = np.histogram(np.clip(matrix, *HIST_RANGE), bins=HIST_BINS, range=HIST_RANGE, density=True)
        layers.append(LayerCondensation(
            index=index,
            name=name,
            mean_cos=float(total / seq_len**2),
            mean_cos_offdiag=float((total - trace) / (seq_len**2 - seq_len)),
            hist=density.tolist(),
        ))
    return layers


def depth_trend(mean_cos: list[float]) -> dict[str, float | None]:
    """Spearman and Kendall's tau between mean cosine and layer index (embedding = 0)."""
    index = list(range(len(mean_cos)))
    return {
        "spearman": _finite_or_none(stats.spearmanr(index, mean_cos).statistic),
        "kendall": _finite_or_none(stats.kendalltau(index, mean_cos).statistic),
    }


def last_n(mean_cos: list[float]) -> list[LastN]:
    """Mean of the last n layers' mean cosine, for n = 1 … L."""
    return [LastN(n, float(np.mean(mean_cos[-n:]))) for n in range(1, len(mean_cos) + 1)]


def summarize(names: list[str], means: torch.Tensor) -> dict:
    """``layers``, ``spearman``, ``kendall`` and ``last_n`` of one checkpoint (``Condensation`` fields)."""
    layers = layer_statistics(names, means)
    curve = [layer.mean_cos for layer in layers]
    return {"layers": layers, **depth_trend(curve), "last_n": last_n(curve)}


def condensation(step: int, sequences: Sequences, names: list[str], means: torch.Tensor, *, dtype: str,
                 device: str, checkpoint: str, run: str, model_args: dict) -> Condensation:
    """The full result of one measured model: statistics plus what they were measured on."""
    return Condensation(
        step=step,
        num_sequences=sequences.options.num_sequences,
        seq_len=sequences.options.seq_len,
        **summarize(names, means),
        hist_bins=HIST_BINS,
        hist_range=list(HIST_RANGE),
        inputs=sequences.record(),
        dtype=dtype,
        device=device,
        checkpoint=checkpoint,
        run=run,
        model_args=model_args,
    )
