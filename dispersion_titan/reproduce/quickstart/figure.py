"""``summary.png``: the measurements behind the paper's four findings, the init panel above, the
trained toy models below (the two never share an axis), each panel titled with its verdicts. Colour
and marker: the MLP width; solid: baseline, dashed: dispersion; extra seeds dotted, their spread shaded."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure, SubFigure
from matplotlib.lines import Line2D
from matplotlib.offsetbox import AnchoredOffsetbox, TextArea, VPacker
from matplotlib.ticker import LogLocator, NullLocator, ScalarFormatter

from ...analysis.condensation_schema import Condensation
from ...analysis.figures import plot_curve
from ...run_folder.outputs import headless_pyplot
from .findings import AGREES, DISAGREES, Finding, InitPanel, Part, RunCondensation, baselines, late_cos, panel_shape

plt = headless_pyplot()

LATE = "late-block mean_cos_offdiag"
VERDICT_COLOURS = {AGREES: "tab:green", DISAGREES: "tab:red"}  # else: within noise
NOISE_COLOUR = "darkorange"
MARKERS = "osD^vP"
DODGE = 0.07  # blocks are categories: each width's points this far apart keep equal values visible


def _style(widths: Sequence[int]) -> dict[int, dict]:
    shades = plt.cm.viridis(np.linspace(0.0, 0.85, len(widths)))
    return {w: {"color": tuple(shades[i]), "marker": MARKERS[i % len(MARKERS)]} for i, w in enumerate(sorted(widths))}


def _title(ax: plt.Axes, number: int, finding: Finding, part: Part | None, when: str) -> None:
    """The finding's verdict in its colour, then that of the measurement drawn (None: none was measured) and of the
    others."""
    if part is None:
        drawn = f"{when}: one MLP width, nothing to compare"
    else:
        drawn = f"{when}: {part.verdict}" + ("" if part.decides else " (context, not part of the verdict)")
    others = [f"{p.scope}: {p.verdict}" for p in finding.parts if p.decides and p is not part]
    lines = textwrap.wrap(f"{number}. {finding.question} — {finding.verdict}", 60)
    lines += textwrap.wrap("; ".join([drawn, *others]), 64)
    ax.set_title("\n".join(lines), fontsize="medium", color=VERDICT_COLOURS.get(finding.verdict, NOISE_COLOUR))


def _by_width(ax: plt.Axes, values: dict[int, float], seeds: list[float], style: dict[int, dict], label: str) -> None:
    """Finding 2: the late-block cosine against width; the seeds at the narrowest as a bar."""
    widths = sorted(values)
    ax.plot(widths, [values[w] for w in widths], color="0.4", zorder=1)
    for w in widths:
        ax.plot([w], [values[w]], linestyle="", markersize=7, **style[w])
    if len(seeds) > 1:
        mean, colour = np.mean(seeds), style[widths[0]]["color"]
        low_high = [[mean - min(seeds)], [max(seeds) - mean]]
        ax.errorbar([widths[0]], [mean], yerr=low_high, fmt="none", ecolor=colour, elinewidth=2, capsize=5, zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set(xlabel="MLP hidden width", ylabel=label)
    ax.margins(x=0.08)


def _init_depth(ax: plt.Axes, panel: InitPanel, style: dict[int, dict]) -> None:
    """Finding 1: the cosine against depth at step 0, per width (the extra seeds dotted)."""
    for width, result in sorted(panel.widths.items()):
        plot_curve(ax, result, label=f"MLP {width}", markersize=4, **style[width])
    for result in list(panel.seeds.values())[1:]:  # the extra seeds, at the narrowest width
        plot_curve(ax, result, linestyle=":", markersize=4, **style[min(panel.widths)])
    ax.set(xlabel="layer fraction (0: embedding, 1: final norm)", ylabel="mean_cos_offdiag")


def _verdicts(ax: plt.Axes, found: Sequence[Finding], key: str) -> None:
    """Every finding's verdict with each deciding effect and seed spread, then ``key``, stacked top down."""
    ax.axis("off")
    lines = []
    for number, finding in enumerate(found, start=1):
        head = textwrap.fill(f"{number}. {finding.question} — {finding.verdict}", 58)
        colour = VERDICT_COLOURS.get(finding.verdict, NOISE_COLOUR)
        lines.append(TextArea(head, textprops={"fontsize": "small", "weight": "bold", "color": colour}))
        for part in (p for p in finding.parts if p.decides):
            line = textwrap.fill(
                f"{part.scope}: {part.verdict} ({part.noise})", 68, initial_indent="  ", subsequent_indent="    "
            )
            lines.append(TextArea(line, textprops={"fontsize": "x-small"}))
    lines.append(TextArea(textwrap.fill(key, 80), textprops={"fontsize": "x-small", "color": "0.3"}))
    stack = VPacker(children=lines, align="left", pad=0, sep=4)
    ax.add_artist(AnchoredOffsetbox("upper left", child=stack, frameon=False, pad=0, borderpad=0))


def _band(ax: plt.Axes, x: Sequence[float], curves: Sequence[Sequence[float]], colour) -> None:
    ax.fill_between(x, np.min(curves, axis=0), np.max(curves, axis=0), color=colour, alpha=0.2, linewidth=0)


def _toy_training(
    ax: plt.Axes, runs: Sequence[RunCondensation], toy: Sequence[RunCondensation], style: dict[int, dict]
) -> None:
    """Finding 3: the baselines' late-block cosine at every checkpoint; ticks at the checkpoints."""
    steps = sorted(toy[0].trajectory)
    for r in toy:
        ax.plot(steps, [r.trajectory[s] for s in steps], markersize=4, **style[r.width])
    first = toy[0]
    others = [r for r in runs if r.is_baseline and r.width == first.width and r.seed != first.seed]
    for r in others:
        ax.plot(steps, [r.trajectory[s] for s in steps], linestyle=":", markersize=3, **style[r.width])
    if others:
        _band(ax, steps, [[r.trajectory[s] for s in steps] for r in (first, *others)], style[first.width]["color"])
    ax.set_xticks(steps)
    ax.set(xlabel="training step (checkpoints; baselines)", ylabel=LATE)


def _blocks(result: Condensation) -> list[float]:
    return [layer.mean_cos_offdiag for layer in result.layers if layer.name.startswith("block_")]


def _toy_dispersion(ax: plt.Axes, runs: Sequence[RunCondensation], seed: int, style: dict[int, dict]) -> None:
    """Finding 4: the final cosine per block, baseline (solid) and dispersion (dashed) per width."""
    widths = sorted({r.width for r in runs})
    drawn = []
    for i, width in enumerate(widths):
        for run in (r for r in runs if r.width == width and r.seed == seed):
            values = _blocks(run.final)
            drawn += values
            x = np.arange(1, len(values) + 1) + DODGE * (i - (len(widths) - 1) / 2)
            line, face = ("-", style[width]["color"]) if run.is_baseline else ("--", "none")
            ax.plot(x, values, linestyle=line, markersize=5, markerfacecolor=face, **style[width])
            seeds = [r for r in runs if (r.width, r.dispersion) == (width, run.dispersion) and r.seed != seed]
            if seeds:
                _band(ax, x, [_blocks(r.final) for r in (run, *seeds)], style[width]["color"])
    ax.set_xticks(range(1, len(values) + 1))
    # A dispersed block sits near 0 at every width (the loss's floor): on a linear axis its
    # widths' small differences vanish under one line; a log axis keeps them apart.
    if min(drawn) > 0:
        ax.set_yscale("log")
        ax.set_ylim(min(drawn) / 1.5, max(drawn) * 1.5)
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
    ax.set(
        xlabel=f"block (step {runs[0].final.step})",
        ylabel="mean_cos_offdiag" + (" (log scale)" if min(drawn) > 0 else ""),
    )


def _key(row: SubFigure, title: str, style: dict[int, dict], extra: list[tuple[str, dict]]) -> None:
    """The row's title over its key, in one line: the widths, then ``extra`` (label, line style)."""
    handles = [Line2D([], [], label=f"MLP {w}", **s) for w, s in style.items()]
    handles += [Line2D([], [], color="0.3", label=label, **kwargs) for label, kwargs in extra]
    key = row.legend(
        handles=handles, loc="outside upper center", ncols=len(handles), fontsize="small", frameon=False, title=title
    )
    key.get_title().set_fontweight("bold")


def findings_figure(panel: InitPanel, runs: Sequence[RunCondensation], found: Sequence[Finding], seed: int) -> Figure:
    toy = baselines(runs, seed)
    fig = plt.figure(figsize=(16, 9.5), layout="constrained")
    top, bottom = fig.subfigures(2, 1)
    init_axes, toy_axes = top.subplots(1, 3), bottom.subplots(1, 3)
    args = toy[0].final.model_args
    init_style, toy_style = _style(sorted(panel.widths)), _style(sorted({r.width for r in runs}))
    trained = f"after {toy[0].final.step} steps"
    _init_depth(init_axes[0], panel, init_style)
    _title(init_axes[0], 1, found[0], found[0].parts[0], "at step 0")
    init_seeds = [late_cos(r) for r in panel.seeds.values()]
    _by_width(init_axes[1], {w: late_cos(r) for w, r in panel.widths.items()}, init_seeds, init_style, LATE)
    _title(init_axes[1], 2, found[1], found[1].parts[0], "at step 0")
    _verdicts(
        init_axes[2],
        found,
        "A verdict agrees only where the effect exceeds the seed-to-seed spread of "
        "the same quantity (the bar or band between the seeds at the smallest width).",
    )
    extra = [f"seed {s}" for s in list(panel.seeds)[1:]]
    _key(
        top,
        f"Init panel, step 0: GPT-2 {panel_shape(panel).removeprefix('init panel: ')}",
        init_style,
        [(f"{', '.join(extra)} (MLP {min(panel.widths)})", {"linestyle": ":"})] if extra else [],
    )
    others = sorted({r.seed for r in runs if r.seed != seed})
    dispersion = next((r.dispersion for r in runs if not r.is_baseline), None)
    _key(
        bottom,
        f"Toy models, trained: dim {args['dim']}, {args['n_layers']} blocks",
        toy_style,
        [
            ("baseline", {"marker": "o"}),
            *([(dispersion, {"marker": "o", "linestyle": "--", "markerfacecolor": "none"})] if dispersion else []),
            *([(f"seed {', '.join(map(str, others))} (MLP {toy[0].width})", {"linestyle": ":"})] if others else []),
        ],
    )
    toy_seeds = [late_cos(r.final) for r in runs if r.is_baseline and r.width == toy[0].width]
    final = {r.width: late_cos(r.final) for r in toy}
    _by_width(toy_axes[0], final, toy_seeds, toy_style, f"{LATE}, step {toy[0].final.step}")
    toy_width = found[1].parts[1] if len(found[1].parts) > 1 else None  # with_width: the init panel's, then this
    _title(toy_axes[0], 2, found[1], toy_width, trained)
    _toy_training(toy_axes[1], runs, toy, toy_style)
    _title(toy_axes[1], 3, found[2], found[2].parts[0], f"steps 0 to {toy[0].final.step}")
    _toy_dispersion(toy_axes[2], runs, seed, toy_style)
    _title(toy_axes[2], 4, found[3], found[3].parts[0], trained)
    for ax in (*init_axes[:2], *toy_axes):
        ax.grid(alpha=0.3)
    return fig
