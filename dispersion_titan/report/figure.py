"""One figure for the four questions: late-block cosine against MLP width, at
initialization and at the final step, with and without the dispersion loss.
(``analyze compare`` plots whole depth profiles, but only of one step at a time.)"""

from __future__ import annotations

from itertools import groupby

from ..analysis.figures import save_png  # first: it selects the headless Agg backend
from .summary import RunCondensation, late_cos

import matplotlib.pyplot as plt  # noqa: E402,I001
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402


def _line(ax: plt.Axes, runs: list[RunCondensation], at_init: bool, **style) -> None:
    runs = sorted(runs, key=lambda r: r.width)
    ax.plot([r.width for r in runs], [late_cos(r.init if at_init else r.final) for r in runs], marker="o", **style)


def sweep_figure(runs: list[RunCondensation], title: str) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    baselines = [r for r in runs if r.is_baseline]
    step = max(r.final.step for r in runs)
    _line(ax, baselines or runs, True, color="grey", linestyle=":", label="step 0 (initialization)")
    if baselines:
        _line(ax, baselines, False, color="black", label=f"step {step}, baseline")
    dispersed = sorted((r for r in runs if not r.is_baseline), key=lambda r: r.dispersion)
    for variant, group in groupby(dispersed, key=lambda r: r.dispersion):
        _line(ax, list(group), False, linestyle="--", label=f"step {step}, {variant}")
    ax.set_xscale("log", base=2)
    widths = sorted({r.width for r in runs})
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="MLP hidden width", ylabel="late-block mean_cos_offdiag", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def save_sweep_figure(runs: list[RunCondensation], title: str, path: str) -> None:
    """Written atomically, like every analysis figure."""
    save_png(sweep_figure(runs, title), path)
