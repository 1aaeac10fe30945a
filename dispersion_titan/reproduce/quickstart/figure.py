"""``summary.png``: one panel per finding of the paper, the measurement drawn and the
paper's expected direction and the verdict written beside it."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from ...analysis.condensation_schema import Condensation
from ...analysis.statistics import layer_fraction
from ...run_folder.outputs import headless_pyplot, save_png
from .findings import Finding, panel_shape
from .summary import RunCondensation, late_cos

plt = headless_pyplot()

YLABEL = "late-block mean_cos_offdiag"
# Cosines lie in [-0.05, 1]; the space above 1 holds the verdict box, which so never covers a curve.
YLIM = (-0.05, 1.75)
YTICKS = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
# Every legend right of its panel: never on a curve.
BESIDE = {"fontsize": "x-small", "loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
# A measurement this short (the validation losses) is written in the box; longer ones are the curves.
WRITTEN_CHARS = 70


def _verdict(agrees: bool) -> str:
    return "agrees" if agrees else "disagrees"


def _annotate(ax: plt.Axes, finding: Finding) -> None:
    """The question, and above the curves the paper's direction and the verdict, with each
    deciding measurement's own verdict where there are several."""
    ax.set_title("\n".join(textwrap.wrap(finding.question, 40)), fontsize="medium")
    lines = textwrap.wrap(f"paper: {finding.paper}", 56) + [f"here: {_verdict(finding.agrees)}"]
    deciding = [part for part in finding.parts if part.decides]
    if len(deciding) > 1:
        for part in deciding:
            detail = f" ({part.measured})" if len(part.measured) <= WRITTEN_CHARS else ""
            lines += textwrap.wrap(f"- {part.scope}{detail}: {_verdict(part.agrees)}", 56, subsequent_indent="  ")
    ax.text(0.02, 0.98, "\n".join(lines), transform=ax.transAxes, va="top", fontsize="x-small",
            bbox={"boxstyle": "round", "facecolor": "honeydew" if finding.agrees else "mistyrose", "alpha": 0.9})
    ax.set_ylim(*YLIM)
    ax.set_yticks(YTICKS)
    ax.grid(alpha=0.3)


def _tick_labels(ticks: Sequence[int]) -> list[str]:
    """Width labels on a log2 axis; a label less than an octave from the one before drops a line
    (768 and 1024 side by side would overlap)."""
    labels, lowered = [], False
    for i, tick in enumerate(ticks):
        lowered = i > 0 and tick < 2 * ticks[i - 1] and not lowered
        labels.append(("\n" if lowered else "") + str(tick))
    return labels


def _depth(ax: plt.Axes, panel: dict[int, Condensation]) -> None:
    for width, result in sorted(panel.items()):
        fractions = [layer_fraction(layer.index, len(result.layers)) for layer in result.layers]
        ax.plot(fractions, [layer.mean_cos_offdiag for layer in result.layers], marker=".", label=f"MLP {width}")
    ax.set(xlabel=f"layer fraction ({panel_shape(panel)}, step 0)", ylabel="mean_cos_offdiag")
    ax.legend(**BESIDE)


def _widths(ax: plt.Axes, panel: dict[int, Condensation], toy: Sequence[RunCondensation]) -> None:
    widths = sorted(panel)
    ax.plot(widths, [late_cos(panel[w]) for w in widths], marker="o", label=f"{panel_shape(panel)}, step 0")
    if toy:
        ax.plot([r.width for r in toy], [late_cos(r.final) for r in toy], marker="s",
                label=f"toy, step {toy[0].final.step}")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(widths) | {r.width for r in toy})
    ax.set_xticks(ticks, _tick_labels(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="MLP hidden width", ylabel=YLABEL)
    ax.legend(**BESIDE)


def _training(ax: plt.Axes, toy: Sequence[RunCondensation]) -> None:
    for run in toy:
        steps = sorted(run.trajectory)
        ax.plot(steps, [run.trajectory[s] for s in steps], marker=".", label=f"toy MLP {run.width}")
    ax.set(xlabel="training step (baseline runs)", ylabel=YLABEL)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.legend(**BESIDE)


def _dispersion(ax: plt.Axes, runs: Sequence[RunCondensation], seed: int) -> None:
    for run in (r for r in runs if r.seed == seed):
        blocks = [layer for layer in run.final.layers if layer.name.startswith("block_")]
        ax.plot(range(1, len(blocks) + 1), [b.mean_cos_offdiag for b in blocks], marker=".",
                linestyle="-" if run.is_baseline else "--",
                label=f"MLP {run.width}, {'baseline' if run.is_baseline else run.dispersion}")
    ax.set(xlabel=f"block (toy, step {runs[0].final.step})", ylabel="mean_cos_offdiag")
    ax.set_xticks(range(1, len(blocks) + 1))  # blocks are whole numbers
    ax.legend(**BESIDE)


def findings_figure(panel: dict[int, Condensation], runs: Sequence[RunCondensation], found: Sequence[Finding],
                    seed: int) -> Figure:
    toy = sorted((r for r in runs if r.is_baseline and r.seed == seed), key=lambda r: r.width)
    fig, axes = plt.subplots(2, 2, figsize=(13.5, 8.5), layout="constrained")
    _depth(axes[0, 0], panel)
    _widths(axes[0, 1], panel, toy)
    _training(axes[1, 0], toy)
    _dispersion(axes[1, 1], runs, seed)
    for ax, finding in zip(axes.flat, found):
        _annotate(ax, finding)
    fig.suptitle("Embedding condensation: the paper's findings, measured")
    return fig


def save_findings_figure(panel: dict[int, Condensation], runs: Sequence[RunCondensation],
                         found: Sequence[Finding], seed: int, path: str) -> None:
    """Written atomically, like every analysis figure."""
    save_png(findings_figure(panel, runs, found, seed), path)
