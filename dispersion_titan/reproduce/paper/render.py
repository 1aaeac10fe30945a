"""Draw an artifact from the results its workflow made; nothing is written unless every result is there.
The paper's panels at a two-column paper's full width: per row a depth-trend panel (``plot_trend.py``)
beside one cosine heatmap per model state (``compute_embedding_cossim.py``), on the authors' shared
density scale and y range. ``table2``: ``evaluate table``'s table (one source for its options and tests),
written as Markdown, LaTeX, a figure and ``table2.json``."""

from __future__ import annotations

import math
import os

import numpy as np

from ...analysis.figures import density_mesh
from ...analysis.size_series import last_n_mean
from ...analysis.statistics import finite_or_none
from ...evaluation.table import TESTS, ArmRow, Selection, cell, difference, signed, table
from ...run_folder.outputs import atomic_write, ensure_writable, headless_pyplot, write_json
from . import catalog, collect
from .collect import LAST_N_PANELS, Entry, by_row, half_n
from .workflow import PaperWorkflow

plt = headless_pyplot()

WIDTH_IN = 7.0
PER_LINE = 4  # heatmaps per line of a row; more wrap
DENSITY = (0.0, 10.0)
COS_VIEW = (-0.25, 1.0)
FONT = 7
NUDGE = 0.06  # Spearman left, Kendall right of each x: equal values stay visible
DPI = 150


def save(fig, stem: str) -> None:
    """``stem.png`` and ``stem.pdf``, each written atomically."""
    try:
        for fmt in ("png", "pdf"):
            atomic_write(f"{stem}.{fmt}", lambda f, fmt=fmt: fig.savefig(f, format=fmt, dpi=DPI), binary=True)
    finally:
        plt.close(fig)


def _heatmap(ax, entry: Entry, norm):
    mesh = ax.pcolormesh(*density_mesh(entry.layers), cmap="Reds", norm=norm, rasterized=True)
    ax.set(xlim=(0, 1), ylim=COS_VIEW)
    ax.set_xticks([0, 0.5, 1], ["0", "0.5", "1"])
    ax.set_yticks([-0.25, 0, 0.5, 1], ["−0.25", "0", "0.5", "1"])
    ax.set_title(entry.label, fontsize=FONT)
    ax.tick_params(labelsize=FONT - 1)
    return mesh


def _trend_axes(ax, labels: list[str], title: str) -> None:
    ax.set_ylim(-1.05, 1.05)
    ax.axhline(0, color="grey", lw=0.5)
    upright = len(labels) > 3 or max(map(len, labels)) > 12
    ax.set_xticks(
        range(len(labels)),
        labels,
        rotation=90 if upright else 45,
        ha="center" if upright else "right",
        fontsize=FONT - 1,
    )
    ax.tick_params(axis="y", labelsize=FONT - 1)
    ax.set_xlim(-0.4, len(labels) - 0.6)
    ax.set_ylabel("rank correlation with depth", fontsize=FONT)
    ax.set_title(title, fontsize=FONT)
    ax.grid(alpha=0.3)


def _trend(ax, group: list[Entry], title: str) -> None:
    x, trends = np.arange(len(group)), [e.trend for e in group]
    ax.plot(x - NUDGE, [t["spearman"]["rho"] for t in trends], "o-", color="tab:blue", ms=3, lw=1, label="Spearman ρ")
    ax.plot(x + NUDGE, [t["kendall"]["tau"] for t in trends], "s--", color="tab:red", ms=3, lw=1, label="Kendall τ")
    _trend_axes(ax, tick_labels([e.label for e in group]), title)


def _paired_trend(ax, bases: list[Entry], distilled: list[Entry]) -> None:
    """ρ and τ of each base (solid) and its distilled model (dashed), joined per pair."""
    series = ((-NUDGE, "spearman", "rho", "tab:blue", "Spearman ρ"), (NUDGE, "kendall", "tau", "tab:red", "Kendall τ"))
    for shift, key, stat, color, name in series:
        x = np.arange(len(bases)) + shift
        a = [e.trend[key][stat] for e in bases]
        b = [e.trend[key][stat] for e in distilled]
        ax.plot(x, a, "o-", color=color, ms=3, lw=1, label=f"{name}, base")
        ax.plot(x, b, "o--", color=color, ms=3, lw=1, mfc="white", label=f"{name}, distilled")
        ax.vlines(x, a, b, color=color, lw=0.6, alpha=0.6)
        for xi, ai, bi in zip(x, a, b, strict=True):
            if ai is not None and bi is not None:
                ax.annotate(
                    f"Δ{name[-1]}={bi - ai:+.2f}",
                    (xi, (ai + bi) / 2),
                    xytext=(3 if shift > 0 else -3, 0),
                    textcoords="offset points",
                    ha="left" if shift > 0 else "right",
                    fontsize=FONT - 2,
                    color=color,
                )
    _trend_axes(
        ax,
        [f"{_short(a.label)} →\n{_short(b.label)}" for a, b in zip(bases, distilled, strict=True)],
        "base (solid) vs distilled (dashed)",
    )


def tick_labels(labels: list[str]) -> list[str]:
    """The row's labels without their shared prefix up to a dash (``Qwen2.5-0.5B`` … -> ``0.5B`` …)."""
    prefix = os.path.commonprefix(labels) if len(labels) > 1 else ""
    cut = prefix.rfind("-") + 1
    return [_short(label[cut:] or label) for label in labels]


def _short(label: str) -> str:
    return label if len(label) <= 22 else label[:10] + "…" + label[-10:]


def figure(entries: list[Entry], row_titles: dict[str, str], title: str, paired: bool = False):
    """Rows of [trend panel | heatmaps]; ``paired``: one trend panel for base and distilled."""
    groups = by_row(entries)
    per_line = min(PER_LINE, max(len(g) for g in groups.values()))
    lines = {row: math.ceil(len(g) / per_line) for row, g in groups.items()}
    total = sum(lines.values())
    fig = plt.figure(figsize=(WIDTH_IN, 0.6 + 1.75 * total), layout="constrained")
    grid = fig.add_gridspec(total, per_line + 1, width_ratios=[1.5] + [1] * per_line)
    norm = plt.Normalize(*DENSITY)
    if paired:  # fig5's two rows: the bases, their distilled models
        _paired_trend(fig.add_subplot(grid[:, 0]), *groups.values())
    mesh, line, heat_axes = None, 0, []
    for row, group in groups.items():
        if not paired:
            _trend(fig.add_subplot(grid[line : line + lines[row], 0]), group, row_titles.get(row, row))
        for i, entry in enumerate(group):
            ax = fig.add_subplot(grid[line + i // per_line, 1 + i % per_line])
            mesh = _heatmap(ax, entry, norm)
            heat_axes.append(ax)
            if i % per_line == 0:
                ax.set_ylabel(f"{row}\ncosine similarity", fontsize=FONT)
            if i + per_line >= len(group):
                ax.set_xlabel("layer fraction", fontsize=FONT)
        line += lines[row]
    handles, labels = fig.axes[0].get_legend_handles_labels()  # the first trend panel's
    fig.legend(handles, labels, loc="outside lower left", ncols=len(labels), fontsize=FONT, frameon=False)
    bar = fig.colorbar(mesh, ax=heat_axes, shrink=min(0.8, 2.5 / total), aspect=15, extend="max")
    bar.set_label("density (shared scale)", fontsize=FONT)
    bar.ax.tick_params(labelsize=FONT - 1)
    fig.suptitle(title, fontsize=FONT + 1)
    return fig


def last_n_figure(entries: list[Entry], title: str):
    """The authors' last-n panels (``plot_trend.py --last-n``), one line per row."""
    groups = by_row(entries)
    panels = len(LAST_N_PANELS) + 1
    fig, axes = plt.subplots(
        len(groups),
        panels,
        figsize=(WIDTH_IN, 0.6 + 1.6 * len(groups)),
        layout="constrained",
        squeeze=False,
        sharey=True,
    )
    for line, (row, group) in zip(axes, groups.items(), strict=True):
        x = np.arange(len(group))
        columns = [(f"last {n}", [last_n_mean(e.result, n) for e in group]) for n in LAST_N_PANELS]
        columns.append(("last L//2+1", [last_n_mean(e.result, half_n(len(e.curve))) for e in group]))
        for ax, (name, values) in zip(line, columns, strict=True):
            ax.plot(x, values, "o-", color="tab:blue", ms=3, lw=1)
            ax.set_xticks(x, tick_labels([e.label for e in group]), rotation=90, fontsize=FONT - 2)
            ax.tick_params(axis="y", labelsize=FONT - 1)
            ax.set_title(name, fontsize=FONT)
            ax.grid(alpha=0.3)
        line[0].set_ylabel(f"{row}\nmean cosine", fontsize=FONT)
    fig.suptitle(title, fontsize=FONT + 1)
    return fig


AGAINST = {"n_params": "size", "mlp_width": "MLP width", "step": "step", "training_order": "training"}  # in titles


def render(workflow: PaperWorkflow, selection: Selection, reference: str | None, test: str) -> list[str]:
    """Write the artifact; return the files written."""
    ensure_writable(workflow.out, "--out")
    stem = os.path.join(workflow.out, workflow.artifact)
    if workflow.artifact == "table2":
        print(write_table2(workflow, stem, selection, reference, test))
        return [f"{stem}.{ext}" for ext in ("md", "tex", "json", "png", "pdf")]
    entries = collect.entries(workflow)
    numbers = collect.numbers(workflow, entries)
    titles = {}  # a row's title, with its trend statistic where it has one
    for row in numbers["rows"]:
        rho = row["spearman"] and row["spearman"]["rho"]
        trend = "" if rho is None else f"\n{AGAINST[row['against']]} vs last-{collect.LAST_N} cos: ρ={rho:+.2f}"
        titles[row["row"]] = row["row"] + trend
    inputs = next(iter(numbers["inputs"].values()))
    points = {"hidden_states": "n+1 hidden_states points", "all": "all n+2 layer points"}[inputs["layer_points"]]
    name = catalog.ARTIFACTS[workflow.artifact][0]  # the paper's figure
    title = f"{name}: K={inputs['num_sequences']}, S={inputs['seq_len']}, {points}"
    save(figure(entries, titles, title, paired=workflow.artifact == "fig5"), stem)
    save(last_n_figure(entries, f"{name}: mean cosine of the last N layer points"), f"{stem}_last_n")
    write_json(f"{stem}.json", numbers)
    return [f"{stem}.{ext}" for ext in ("png", "pdf", "json")] + [f"{stem}_last_n.{ext}" for ext in ("png", "pdf")]


def _cells(row: ArmRow) -> list[str]:
    return [
        row.name,
        str(len(row.runs)),
        *(cell(row.mean[key], row.std[key], key) for key in row.mean),
        "" if row.p_value is None else f"{row.p_value:.3g}{row.significance}",
    ]


def latex(columns: list[str], rows: list[ArmRow], reference: str, pretrained: ArmRow | None) -> str:
    def esc(text: str) -> str:
        return text.replace("\\", r"\textbackslash{}").replace("_", r"\_").replace("%", r"\%").replace("&", r"\&")

    header = ["arm", "seeds", *columns, "average", f"p vs {reference}"]
    lines = [
        r"\begin{tabular}{l" + "c" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(esc(h) for h in header) + r" \\",
        r"\midrule",
    ]
    for row in rows:
        lines.append(" & ".join(esc(c).replace("±", r"$\pm$") for c in _cells(row)) + r" \\")
        if pretrained is not None and row is not pretrained:  # the authors' second line: the difference
            shown = [signed(value, key) for key, value in difference(row, pretrained).items()]
            lines.append(" & ".join(["", "", *shown, ""]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _figure(columns: list[str], rows: list[ArmRow], reference: str, rule: str, test: str, stem: str) -> None:
    header = ["arm", "seeds", *[c.replace("/", "/\n") for c in columns], "average", f"p vs\n{reference}"]
    body = [_cells(row) for row in rows]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.9 + 0.35 * len(rows)), layout="constrained")
    ax.axis("off")
    shown = ax.table(cellText=body, colLabels=header, loc="center", cellLoc="center")
    shown.auto_set_font_size(False)
    shown.set_fontsize(FONT - 1)
    shown.scale(1, 2.2)
    ax.set_title(
        f"Mean ± std over seeds (checkpoint per run: {rule}); {TESTS[test]} t-test against {reference}: "
        "* p<0.05, ** p<0.01, *** p<0.001",
        fontsize=FONT,
    )
    save(fig, stem)


def _numbers(columns: list[str], row: ArmRow, pretrained: ArmRow | None) -> dict:
    return {
        "arm": row.name,
        "runs": [r.run for r in row.runs],
        "steps": [r.step for r in row.runs],
        "mean": {c: finite_or_none(row.mean[c]) for c in columns},
        "std": {c: finite_or_none(row.std[c]) for c in columns},
        "average_mean": finite_or_none(row.mean["average"]),
        "average_std": finite_or_none(row.std["average"]),
        "avg_rank": finite_or_none(row.rank),
        "p_value": finite_or_none(row.p_value),
        "significance": row.significance,
        "difference": {k: finite_or_none(v) for k, v in difference(row, pretrained).items()},
    }


def write_table2(workflow: PaperWorkflow, stem: str, selection: Selection, reference: str | None, test: str) -> str:
    """``DIR/table2.{md,tex,json,png,pdf}`` (and ``evaluate table``'s files in ``DIR/table2/``)."""
    made = table(workflow.runs, stem, selection, reference, test, workflow.pretrained)
    base, columns = made.pretrained, made.columns
    rows = ([base] if base else []) + made.rows
    atomic_write(f"{stem}.md", lambda f: f.write(made.markdown))
    atomic_write(f"{stem}.tex", lambda f: f.write(latex(columns, rows, made.reference, base)))
    write_json(
        f"{stem}.json",
        {
            "artifact": "table2",
            "select": str(selection),
            "test": test,
            "reference": made.reference,
            "columns": columns,
            "pretrained": None if base is None else _numbers(columns, base, None),
            "arms": [_numbers(columns, row, base) for row in made.rows],
        },
    )
    _figure(columns, rows, made.reference, selection.rule, test, stem)
    return made.markdown
