"""``table2``: the paper's Table 2 from evaluated runs. ``evaluate table``'s own function
makes it (arms, best checkpoint, mean ± std, significance: one call, so its options
and tests stay the one source); this module writes that table as Markdown, LaTeX, a
figure and ``table2.json``."""

from __future__ import annotations

import csv
import math
import os

from ...evaluation.protocol import is_accuracy
from ...evaluation.table import PRETRAINED, TESTS, Selection, table
from ...run_folder.outputs import atomic_write, write_json
from .draw import FONT, WIDTH_IN, plt, save


def _float(text: str) -> float | None:
    return None if text in ("", "nan") else float(text)


def _columns(header: list[str]) -> list[str]:
    return [h.removesuffix("_mean") for h in header if h.endswith("_mean") and h != "average_mean"]


def _cell(mean: float | None, std: float | None, digits: int) -> str:
    if mean is None:
        return ""
    return f"{mean:.{digits}f}" + ("" if std is None or math.isnan(std) else f" ± {std:.{digits}f}")


def _rows(path: str) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return _columns(reader.fieldnames or []), rows


def _cells(columns: list[str], row: dict) -> list[str]:
    cells = [_cell(_float(row[f"{c}_mean"]), _float(row[f"{c}_std"]), 4 if is_accuracy(c) else 2) for c in columns]
    p = _float(row["p_value"])
    return [
        row["arm"],
        row["seeds"],
        *cells,
        _cell(_float(row["average_mean"]), _float(row["average_std"]), 4),
        "" if p is None else f"{p:.3g}{row['significance']}",
    ]


def latex(columns: list[str], rows: list[dict], reference: str) -> str:
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
        lines.append(" & ".join(esc(c).replace("±", r"$\pm$") for c in _cells(columns, row)) + r" \\")
        if row["arm"] != PRETRAINED and _float(row["average_diff"]) is not None:  # the authors' second line
            lines.append(" & ".join(["", "", *_differences(columns, row), ""]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def _differences(columns: list[str], row: dict) -> list[str]:
    """The row's differences from the Pretrained row, signed, as the authors' second line of each row."""
    return [
        f"{_float(row[f'{c}_diff']):+.{4 if is_accuracy(c) or c == 'average' else 2}f}" for c in (*columns, "average")
    ]


def _figure(columns: list[str], rows: list[dict], reference: str, rule: str, test: str, stem: str) -> None:
    header = ["arm", "seeds", *[c.replace("/", "/\n") for c in columns], "average", f"p vs\n{reference}"]
    body = [_cells(columns, row) for row in rows]
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


def _numbers(columns: list[str], row: dict) -> dict:
    return {
        "arm": row["arm"],
        "runs": row["runs"].split(";"),
        "steps": [int(s) for s in row["steps"].split(";")],
        "mean": {c: _float(row[f"{c}_mean"]) for c in columns},
        "std": {c: _float(row[f"{c}_std"]) for c in columns},
        "average_mean": _float(row["average_mean"]),
        "average_std": _float(row["average_std"]),
        "avg_rank": _float(row["avg_rank"]),
        "p_value": _float(row["p_value"]),
        "significance": row["significance"],
        "difference": {c: _float(row[f"{c}_diff"]) for c in (*columns, "average")},
    }


def write_table2(
    specs: list[str], out: str, selection: Selection, reference: str | None, test: str, pretrained: str = "auto"
) -> str:
    """``out/table2.{md,tex,json,png,pdf}`` (and ``evaluate table``'s files in ``out/table2/``)."""
    folder = os.path.join(out, "table2")
    markdown = table(specs, folder, selection, reference, test, pretrained)
    rule = selection.rule
    columns, rows = _rows(os.path.join(folder, "table.csv"))
    reference = rows[0]["reference"]
    atomic_write(os.path.join(out, "table2.md"), lambda f: f.write(markdown))
    atomic_write(os.path.join(out, "table2.tex"), lambda f: f.write(latex(columns, rows, reference)))
    base = next((row for row in rows if row["arm"] == PRETRAINED), None)
    write_json(
        os.path.join(out, "table2.json"),
        {
            "artifact": "table2",
            "select": str(selection),
            "test": test,
            "reference": reference,
            "columns": columns,
            "pretrained": None if base is None else _numbers(columns, base),
            "arms": [_numbers(columns, row) for row in rows if row is not base],
        },
    )
    _figure(columns, rows, reference, rule, test, os.path.join(out, "table2"))
    return markdown
