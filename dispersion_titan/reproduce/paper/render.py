"""Draw an artifact from the results its workflow made; nothing is written unless every result is there.
``table2``: ``evaluate table``'s table (one source for its options and tests), written as Markdown, LaTeX,
a figure and ``table2.json``."""

from __future__ import annotations

import os

from ...analysis.statistics import finite_or_none
from ...evaluation.table import TESTS, ArmRow, Selection, cell, difference, signed, table
from ...run_folder.outputs import atomic_write, ensure_writable, write_json
from . import catalog, collect, draw
from .workflow import PaperWorkflow

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
    draw.save(draw.figure(entries, titles, title, paired=workflow.artifact == "fig5"), stem)
    draw.save(draw.last_n_figure(entries, f"{name}: mean cosine of the last N layer points"), f"{stem}_last_n")
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
    fig, ax = draw.plt.subplots(figsize=(draw.WIDTH_IN, 0.9 + 0.35 * len(rows)), layout="constrained")
    ax.axis("off")
    shown = ax.table(cellText=body, colLabels=header, loc="center", cellLoc="center")
    shown.auto_set_font_size(False)
    shown.set_fontsize(draw.FONT - 1)
    shown.scale(1, 2.2)
    ax.set_title(
        f"Mean ± std over seeds (checkpoint per run: {rule}); {TESTS[test]} t-test against {reference}: "
        "* p<0.05, ** p<0.01, *** p<0.001",
        fontsize=draw.FONT,
    )
    draw.save(fig, stem)


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
