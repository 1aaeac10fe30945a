"""Draw an artifact from the results its workflow made; nothing is written unless every result is there.
Every number it draws is read from the analyses (``numbers``: what ``ARTIFACT.json`` holds), over the layer
points each analysis was made with. The paper's panels at a two-column paper's full width: per row a
depth-trend panel (``plot_trend.py``) beside one cosine heatmap per model state (``compute_embedding_cossim.py``),
on the authors' shared density scale and y range. ``table2``: ``evaluate table``'s table (one source for its
options and tests), written as Markdown, LaTeX, a figure and ``table2.json``."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import numpy as np

from ...analysis import DEFAULT_LAST_N as LAST_N  # the layers averaged for a row's trend
from ...analysis.condensation_schema import Condensation, LayerCondensation, read_analyses
from ...analysis.figures import density_mesh
from ...analysis.inputs import differences
from ...analysis.size_series import last_n_mean
from ...analysis.statistics import finite_or_none, point_layers, rank_trend
from ...evaluation.protocol import TESTS
from ...evaluation.table import ArmRow, Selection, difference, difference_cells, row_cells, table
from ...run_folder.outputs import atomic_write, headless_pyplot, revision_folder, staged, write_json
from ...utils.errors import ArgumentError
from . import catalog
from .workflow import STAGE_BRANCH, PaperModel, PaperWorkflow

plt = headless_pyplot()

_TOKENS = re.compile(r"tokens(\d+(?:\.\d+)?[KMBT]?)", re.IGNORECASE)  # OLMo's branches: stage1-step1000-tokens5B: 5B


@dataclass(frozen=True)
class Entry:
    label: str
    row: str
    result: Condensation
    folder: str
    """Its analyses folder (a run's: where a relative input recorded by an earlier version is looked for)."""

    @property
    def layers(self) -> list[LayerCondensation]:
        return point_layers(self.result)

    @property
    def curve(self) -> list[float]:
        return [layer.mean_cos for layer in self.layers]

    @property
    def trend(self) -> dict:
        """The depth trend: Spearman and Kendall of mean_cos against layer index (embedding = 0)."""
        return rank_trend(list(range(len(self.curve))), self.curve)

    @property
    def inputs(self) -> dict:
        """What it was analysed with, but the token ids (they differ between tokenizers)."""
        return {k: v for k, v in self.result.inputs.items() if k != "tokens_sha256"}


def by_row(entries: list[Entry]) -> dict[str, list[Entry]]:
    """The entries of each row, rows and entries in workflow order."""
    rows: dict[str, list[Entry]] = {}
    for entry in entries:
        rows.setdefault(entry.row, []).append(entry)
    return rows


LAST_N_PANELS = (1, 2, 3, 4, 5)  # plot_trend.py --last-n, and half_n
AGAINST = {"fig3": "mlp_width", "fig4": "training_order", "counteract": "step"}  # a row's trend; else n_params


def half_n(points: int) -> int:
    return points // 2 + 1


def revision_label(revision: str) -> str:
    """Fig. 4's point names, as the paper's axis: ``stage2-step13000-...`` -> ``S2-13k``, ``main`` -> ``Main``."""
    if match := STAGE_BRANCH.match(revision):
        step = int(match.group(2))
        return f"S{match.group(1)}-{step // 1000}k" if step >= 1000 else f"S{match.group(1)}-{step}"
    return "Main" if revision == "main" else revision


def _missing(workflow: PaperWorkflow, model: PaperModel, what: str) -> ArgumentError:
    """Names the workflow's analyze command that makes it."""
    command = next(step.shell() for step in workflow.steps if step.argv[-1] == model.out)
    return ArgumentError(
        f"{workflow.artifact}: no analysis of {what} in {model.out}; "
        f"run {command} (or this command without --draw-only)"
    )


def _entries(workflow: PaperWorkflow, model: PaperModel) -> list[Entry]:
    found = read_analyses(model.out)
    steps = sorted(found[name].step for name in found if name.startswith("step-"))
    if workflow.artifact == "fig3":  # its first and last checkpoints: the earliest and latest step analysed
        if len(steps) < 2:
            raise _missing(workflow, model, f"{model.label}'s first and last checkpoints")
        drawn = {"first": found[f"step-{steps[0]}"], "last": found[f"step-{steps[-1]}"]}
        r = drawn["last"]  # a panel's title, as the authors' figure: the MLP width and the model's parameters
        label = f"MLP {r.mlp_width}" + (f" ({r.n_params / 1e6:.0f} M params)" if r.n_params else "")
        return [Entry(label, f"{row} checkpoint", drawn[row], model.out) for row in workflow.rows]
    if workflow.artifact == "counteract":  # every checkpoint, titled by its step (plot_heatmaps.py)
        if not steps:
            raise _missing(workflow, model, f"{model.label}'s checkpoints")
        return [Entry(f"step {step}", model.row, found[f"step-{step}"], model.out) for step in steps]
    if model.steps is not None:
        folder = f"step-{model.steps}"
        if folder not in found:
            raise _missing(workflow, model, f"{model.label} step {model.steps}")
        return [Entry(model.label, model.row or "runs", found[folder], model.out)]
    entries = []
    for revision in model.spec.revisions:
        folder = revision_folder(revision)
        if folder not in found:
            raise _missing(workflow, model, f"{model.label}" + (f"@{revision}" if revision else ""))
        result = found[folder]
        label = model.label if revision is None else revision_label(revision)
        entries.append(Entry(label, model.row or str(result.model_args.get("model_type")), result, model.out))
    return entries


def entries(workflow: PaperWorkflow) -> list[Entry]:
    """Every model state of the workflow, in workflow order; refuses mixed inputs within a row."""
    found = [entry for model in workflow.models for entry in _entries(workflow, model)]
    for first, *others in by_row(found).values():
        for other in others:  # their files located, as ``family`` compares them (``Condensation.located_inputs``)
            a, b = ({**e.result.located_inputs(e.folder), "tokens_sha256": None} for e in (first, other))
            if a != b:
                raise ArgumentError(
                    f"{workflow.artifact}: {other.label} was analyzed with other inputs than "
                    f"{first.label} ({differences(a, b)}); use another --out"
                )
    return found


def model_numbers(entry: Entry) -> dict:
    r = entry.result
    return {
        "label": entry.label,
        "row": entry.row,
        "model": r.model or r.run,
        "revision": r.revision,
        "step": r.step,
        "tokens_seen": next(iter(_TOKENS.findall(r.revision or "")), None),
        "n_params": r.n_params,
        "layer_points": r.inputs["layer_points"],
        "layers": [layer.name for layer in entry.layers],
        "mean_cos": entry.curve,
        **entry.trend,
        f"mean_cos_last_{LAST_N}": last_n_mean(entry.result, LAST_N),
        "mean_cos_last_n": {str(n): last_n_mean(entry.result, n) for n in LAST_N_PANELS},
        "half_n": half_n(len(entry.curve)),
        "mean_cos_last_half": last_n_mean(entry.result, half_n(len(entry.curve))),
        "mean_cos_last_half_table": last_n_mean(entry.result, max(1, len(entry.curve) // 2)),
        "tokens_sha256": r.tokens_sha256,
    }


def row_numbers(workflow: PaperWorkflow, found: list[Entry]) -> list[dict]:
    rows = []
    for row, group in by_row(found).items():
        against = AGAINST.get(workflow.artifact, "n_params")
        # fig4: the revisions in training order (a stage's steps restart from 0)
        x = [float(getattr(e.result, against, i)) for i, e in enumerate(group)]
        y = [last_n_mean(e.result, LAST_N) for e in group]
        rows.append(
            {
                "row": row,
                "models": [e.label for e in group],
                "against": against,
                "x": x,
                f"mean_cos_last_{LAST_N}": y,
                **(rank_trend(x, y) if len(group) >= 2 else {"spearman": None, "kendall": None}),
            }
        )
    return rows


def pair_numbers(workflow: PaperWorkflow, found: list[Entry]) -> list[dict]:
    """fig5: distilled − base of the depth trend and of the last-n mean cosine, the i-th base with the i-th."""
    rows = by_row(found) if workflow.artifact == "fig5" else {"base": [], "distilled": []}
    return [
        {
            "base": base.label,
            "distilled": distilled.label,
            "delta_spearman": _delta(distilled.trend["spearman"]["rho"], base.trend["spearman"]["rho"]),
            "delta_kendall": _delta(distilled.trend["kendall"]["tau"], base.trend["kendall"]["tau"]),
            f"delta_mean_cos_last_{LAST_N}": last_n_mean(distilled.result, LAST_N) - last_n_mean(base.result, LAST_N),
        }
        for base, distilled in zip(rows["base"], rows["distilled"], strict=True)
    ]


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def numbers(workflow: PaperWorkflow, found: list[Entry]) -> dict:
    """``ARTIFACT.json``: everything drawn, and what it was measured on."""
    return {
        "artifact": workflow.artifact,
        "inputs": {row: group[0].inputs for row, group in by_row(found).items()},
        "depth_trend": "Spearman's rho and Kendall's tau of per-layer mean_cos against layer index "
        "(embedding = 0) over each model's layer points, two-sided p-values (scipy)",
        "last_n": "mean_cos_last_n: the mean of the last N layer points, N = 1..5; mean_cos_last_half: of "
        "the last half_n = L//2+1 of L points (the authors' plot_trend.py --last-n panels); "
        "mean_cos_last_half_table: of the last max(1, L//2) (their cossim_family_tables.py's last half mean)",
        "models": [model_numbers(e) for e in found],
        "rows": row_numbers(workflow, found),
        "pairs": pair_numbers(workflow, found),
    }


WIDTH_IN = 7.0
PER_LINE = 4  # heatmaps per line of a row; more wrap
DENSITY = (0.0, 10.0)
COS_VIEW = (-0.25, 1.0)
FONT = 7
NUDGE = 0.06  # Spearman left, Kendall right of each x: equal values stay visible
DPI = 150


def save(fig, stem: str) -> None:
    """``stem.png`` and ``stem.pdf``, each written atomically; the PDF on the PNG's layout, not computed again
    (its constrained layout is about half of a figure's drawing time)."""
    try:
        atomic_write(f"{stem}.png", lambda f: fig.savefig(f, format="png", dpi=DPI), binary=True)
        fig.set_layout_engine("none")  # the axes stay where the PNG's layout put them
        atomic_write(f"{stem}.pdf", lambda f: fig.savefig(f, format="pdf", dpi=DPI), binary=True)
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
    rotation, ha = (90, "center") if len(labels) > 3 or max(map(len, labels)) > 12 else (45, "right")
    ax.set_xticks(range(len(labels)), labels, rotation=rotation, ha=ha, fontsize=FONT - 1)
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
    pairs = [f"{_short(a.label)} →\n{_short(b.label)}" for a, b in zip(bases, distilled, strict=True)]
    _trend_axes(ax, pairs, "base (solid) vs distilled (dashed)")


def tick_labels(labels: list[str]) -> list[str]:
    """The row's labels without their shared prefix up to a dash (``Qwen2.5-0.5B`` … -> ``0.5B`` …)."""
    prefix = os.path.commonprefix(labels) if len(labels) > 1 else ""
    return [_short(label[prefix.rfind("-") + 1 :] or label) for label in labels]


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
    size = (WIDTH_IN, 0.6 + 1.6 * len(groups))
    fig, axes = plt.subplots(len(groups), panels, figsize=size, layout="constrained", squeeze=False, sharey=True)
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


AXIS_TITLE = {"n_params": "size", "mlp_width": "MLP width", "step": "step", "training_order": "training"}  # in titles


def render(workflow: PaperWorkflow, selection: Selection, reference: str | None, test: str) -> list[str]:
    stem = os.path.join(workflow.out, workflow.artifact)
    if workflow.artifact == "table2":
        print(write_table2(workflow, stem, selection, reference, test))
        return [f"{stem}.{ext}" for ext in ("md", "tex", "json", "png", "pdf")]
    found = entries(workflow)
    drawn = numbers(workflow, found)
    titles = {}  # a row's title, with its trend statistic where it has one
    for row in drawn["rows"]:
        rho = row["spearman"] and row["spearman"]["rho"]
        trend = "" if rho is None else f"\n{AXIS_TITLE[row['against']]} vs last-{LAST_N} cos: ρ={rho:+.2f}"
        titles[row["row"]] = row["row"] + trend
    inputs = next(iter(drawn["inputs"].values()))
    points = {"hidden_states": "n+1 hidden_states points", "all": "all n+2 layer points"}[inputs["layer_points"]]
    name = catalog.ARTIFACTS[workflow.artifact][0]  # the paper's figure
    title = f"{name}: K={inputs['num_sequences']}, S={inputs['seq_len']}, {points}"
    files = [f"{workflow.artifact}{end}" for end in (".png", ".pdf", ".json", "_last_n.png", "_last_n.pdf")]
    with staged(workflow.out, tuple(files)) as new:  # a set: a new figure never beside the last one's numbers
        at = os.path.join(new, workflow.artifact)
        save(figure(found, titles, title, paired=workflow.artifact == "fig5"), at)
        save(last_n_figure(found, f"{name}: mean cosine of the last N layer points"), f"{at}_last_n")
        write_json(f"{at}.json", drawn)
    return [os.path.join(workflow.out, file) for file in files]


def _cells(row: ArmRow) -> list[str]:
    return [*row_cells(row), "" if row.p_value is None else f"{row.p_value:.3g}{row.significance}"]


TEX_ESCAPES = {
    **{c: f"\\{c}" for c in "&%$#_{}"},
    "\\": r"\textbackslash{}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "|": r"\textbar{}",
}
"""LaTeX's special characters in text (an arm named ``disp#2``) as they print."""


def latex(columns: list[str], rows: list[ArmRow], reference: str, pretrained: ArmRow | None) -> str:
    def esc(text: str) -> str:
        return "".join(TEX_ESCAPES.get(c, c) for c in text)

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
            lines.append(" & ".join(["", "", *difference_cells(row, pretrained), ""]) + r" \\")
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
    made = table(workflow.runs, stem, selection, reference, test, workflow.pretrained)  # table2/: staged there
    base, columns = made.pretrained, made.columns
    rows = ([base] if base else []) + made.rows
    out, name = os.path.split(stem)
    with staged(out, tuple(f"{name}.{ext}" for ext in ("md", "tex", "json", "png", "pdf"))) as new:  # as a set
        at = os.path.join(new, name)
        atomic_write(f"{at}.md", lambda f: f.write(made.markdown))
        atomic_write(f"{at}.tex", lambda f: f.write(latex(columns, rows, made.reference, base)))
        write_json(
            f"{at}.json",
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
        _figure(columns, rows, made.reference, selection.rule, test, at)
    return made.markdown
