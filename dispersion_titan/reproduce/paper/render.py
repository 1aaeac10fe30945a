"""Draw an artifact from the results its workflow made; nothing is written unless every result is there."""

from __future__ import annotations

import os

from ...evaluation.table import Selection
from ...run_folder.outputs import ensure_writable, write_json
from . import collect, draw
from .table2 import write_table2
from .workflow import PaperWorkflow

TITLES = {
    "fig2": "Condensation by model size (Fig. 2)",
    "fig3": "Condensation by MLP width (Fig. 3)",
    "fig4": "Condensation over pre-training, from initialization (Fig. 4)",
    "fig5": "Distilled models against their bases (Fig. 5)",
    "counteract": "Mid-training with and without the dispersion loss, checkpoint by checkpoint",
    "robustness": "Condensation by model size on other texts (dataset robustness)",
}
AGAINST = {"n_params": "size", "mlp_width": "MLP width", "step": "step", "training_order": "training"}  # in titles


def render(workflow: PaperWorkflow, selection: Selection, reference: str | None, test: str) -> list[str]:
    """Write the artifact; return the files written."""
    ensure_writable(workflow.out, "--out")
    stem = os.path.join(workflow.out, workflow.artifact)
    if workflow.artifact == "table2":
        print(write_table2(workflow.runs, workflow.out, selection, reference, test, workflow.pretrained))
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
    title = f"{TITLES[workflow.artifact]}: K={inputs['num_sequences']}, S={inputs['seq_len']}, {points}"
    draw.save(draw.figure(entries, titles, title, paired=workflow.artifact == "fig5"), stem)
    draw.save(
        draw.last_n_figure(entries, f"{TITLES[workflow.artifact]}: mean cosine of the last N layer points"),
        f"{stem}_last_n",
    )
    write_json(f"{stem}.json", numbers)
    return [f"{stem}.{ext}" for ext in ("png", "pdf", "json")] + [f"{stem}_last_n.{ext}" for ext in ("png", "pdf")]
