"""The paper's condensation numbers from the per-layer averaged cosine matrices."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from .condensation_schema import Condensation, LastN, LayerCondensation

if TYPE_CHECKING:  # torch-free at import: readers of results import this
    from .inputs import Sequences
    from .measure import Measurement

HIST_BINS = 128
HIST_RANGE = (-1.0, 1.0)
HIST_EDGES = np.linspace(*HIST_RANGE, HIST_BINS + 1)


def layer_row(result: Condensation, layer: LayerCondensation) -> dict:
    """One layer's numbers, as ``summary.csv`` and ``compare_layers.csv`` give them."""
    return {
        "layer_index": layer.index,
        "layer": layer.name,
        "layer_fraction": layer.index / (len(result.layers) - 1),  # embedding 0, final norm 1
        "mean_cos": layer.mean_cos,
        "mean_cos_offdiag": layer.mean_cos_offdiag,
        "effective_rank": layer.effective_rank,
        "mev": layer.mev,
    }


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN: a constant curve has no rank correlation (one seed no std, an untested row no p)."""
    return None if value is None or math.isnan(value) else float(value)


def rank_trend(x: list[float], y: list[float]) -> dict[str, dict[str, float | None]]:
    """Spearman's rho and Kendall's tau (scipy) of y against x, with their two-sided p-values."""
    from scipy import stats  # here: the module is imported by torch- and scipy-free paths

    with warnings.catch_warnings():  # a constant input (models of one size) has none: NaN, shown as "-", not warned
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        spearman, kendall = stats.spearmanr(x, y), stats.kendalltau(x, y)
    return {
        "spearman": {"rho": finite_or_none(spearman.statistic), "p": finite_or_none(spearman.pvalue)},
        "kendall": {"tau": finite_or_none(kendall.statistic), "p": finite_or_none(kendall.pvalue)},
    }


def depth_points(count: int, layer_points: str) -> list[int]:
    """Indices of the ``count`` layers (embedding, blocks, final norm) on the depth axis: all of them, or
    transformers' ``hidden_states`` (the last block's own output left out, the final norm in its place),
    the authors' points."""
    return [i for i in range(count) if layer_points == "all" or i != count - 2]


def point_layers(result: Condensation) -> list[LayerCondensation]:
    """The layers of a result on its depth axis (its ``inputs``' ``layer_points``)."""
    return [result.layers[i] for i in depth_points(len(result.layers), result.inputs["layer_points"])]


def summarize(measured: Measurement, layer_points: str = "all") -> dict:
    """The ``Condensation`` fields of one measured state: per layer, mean cosine with and without the diagonal,
    the density histogram, the geometry; the trend and last-n over ``layer_points``."""
    seq_len = measured.means.shape[-1]
    layers = []
    rows = zip(measured.names, measured.means.double().cpu().numpy(), measured.effective_rank, measured.mev)
    for index, (name, matrix, rank, mev) in enumerate(rows):
        total, trace = matrix.sum(), np.trace(matrix)
        density, _ = np.histogram(np.clip(matrix, *HIST_RANGE), bins=HIST_BINS, range=HIST_RANGE, density=True)
        layers.append(
            LayerCondensation(
                index=index,
                name=name,
                mean_cos=float(total / seq_len**2),
                mean_cos_offdiag=float((total - trace) / (seq_len**2 - seq_len)),
                hist=density.tolist(),
                effective_rank=rank,
                mev=mev,
            )
        )
    curve = [layers[i].mean_cos for i in depth_points(len(layers), layer_points)]
    trend = rank_trend(list(range(len(curve))), curve)  # against layer index (embedding = 0)
    return {
        "layers": layers,
        "spearman": trend["spearman"]["rho"],
        "kendall": trend["kendall"]["tau"],
        "last_n": [LastN(n, float(np.mean(curve[-n:]))) for n in range(1, len(curve) + 1)],  # n = 1 … L
        "geometry_sequences": measured.geometry_sequences,
    }


def condensation(
    step: int, sequences: Sequences, measured: Measurement, *, dtype: str, device: str, checkpoint: str, **metadata: Any
) -> Condensation:
    """The result of one measured state; ``metadata``: the target's fields (``run``, ``model_args``, …)."""
    return Condensation(
        step=step,
        num_sequences=sequences.options.num_sequences,
        seq_len=sequences.options.seq_len,
        **summarize(measured, sequences.options.layer_points),
        hist_bins=HIST_BINS,
        hist_range=list(HIST_RANGE),
        inputs=sequences.record(),
        dtype=dtype,
        device=device,
        checkpoint=checkpoint,
        **metadata,
    )
