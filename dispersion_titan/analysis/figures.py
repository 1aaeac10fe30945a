"""Figures: the cosine-density heatmap (paper Fig. 2a), mean cosine over training, runs side by side
(Fig. 3b). The curves show ``mean_cos_offdiag``: the diagonal's constant share would lift every curve."""

from __future__ import annotations

import numpy as np
from matplotlib.colors import Normalize, PowerNorm
from matplotlib.figure import Figure

from ..run_folder.outputs import headless_pyplot
from .condensation_schema import Condensation, LayerCondensation
from .statistics import HIST_RANGE

plt = headless_pyplot()
DEPTH_LABEL = "layer fraction (embedding = 0, final norm = 1)"


def density_mesh(layers: list[LayerCondensation]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``pcolormesh``'s x edges (half a step around each layer fraction), y edges (over ``HIST_RANGE``)
    and the layers' cosine histograms as density [bins, L]."""
    density = np.array([layer.hist for layer in layers]).T
    half = 0.5 / (len(layers) - 1)
    return np.linspace(-half, 1 + half, len(layers) + 1), np.linspace(*HIST_RANGE, density.shape[0] + 1), density


def heatmap(result: Condensation, title: str) -> Figure:
    """x = layer fraction, y = cosine similarity, colour = density of the S² entries."""
    x_edges, y_edges, density = density_mesh(result.layers)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    # Square-root colour scale: the diagonal's mass and the bulk both stay visible.
    mesh = ax.pcolormesh(x_edges, y_edges, density, cmap="magma", norm=PowerNorm(0.5, vmin=0))
    fig.colorbar(mesh, ax=ax, label="density")
    ax.set(
        xlabel=DEPTH_LABEL,
        ylabel="cosine similarity",
        title=title,
        xlim=(x_edges[0], x_edges[-1]),
        ylim=HIST_RANGE,
    )
    return fig


def curve_axes(ax: plt.Axes, title: str) -> None:
    ax.set(xlabel=DEPTH_LABEL, ylabel="mean_cos_offdiag: mean cosine of distinct token pairs", title=title)
    ax.grid(alpha=0.3)


def plot_curve(ax: plt.Axes, result: Condensation, **style) -> None:
    x = np.linspace(0, 1, len(result.layers))
    ax.plot(x, [layer.mean_cos_offdiag for layer in result.layers], **{"marker": ".", **style})


def outside_legend(ax: plt.Axes) -> None:
    """Right of the axes, so it never hides a curve."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def evolution(results: list[Condensation], title: str) -> Figure:
    """One mean-cosine line per checkpoint, coloured from initialisation to final step."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    curve_axes(ax, title)
    steps = [result.step for result in results]
    norm = Normalize(min(steps), max(max(steps), min(steps) + 1))
    cmap = plt.get_cmap("viridis")
    for result in results:
        plot_curve(ax, result, color=cmap(norm(result.step)), label=result.label)
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="checkpoint step")
    if len(results) <= 12:
        ax.legend(fontsize="small")
    return fig


def comparison(labelled: list[tuple[str, Condensation]], title: str) -> Figure:
    """One mean-cosine line per run, the legend outside the axes; past the 10 colours, another line style (a sweep's
    12 runs would share colours)."""
    fig, ax = plt.subplots(figsize=(9.6, 4.2), layout="constrained")
    curve_axes(ax, title)
    colours, styles = plt.get_cmap("tab10"), ("-", "--", ":", "-.")
    for index, (label, result) in enumerate(labelled):
        plot_curve(ax, result, label=label, color=colours(index % 10), linestyle=styles[index // 10 % len(styles)])
    outside_legend(ax)
    return fig
