"""Condensation results: ``OUT/step-N/condensation.json`` (or ``rev-NAME/``) and ``summary.csv``."""

from __future__ import annotations

import os

from ..run_folder.outputs import RESULT_FOLDER, STEP_FOLDER, read_json_files
from .condensation_schema import Condensation, LayerCondensation
from .statistics import layer_fraction

RESULT_FILE = "condensation.json"
SUMMARY_FILE = "summary.csv"


def read_analyses(out: str) -> dict[str, Condensation]:
    """Every analysis stored in ``out``, by result folder name, in name order."""
    return {
        name: Condensation.from_json(data, os.path.join(out, name, RESULT_FILE))
        for name, data in read_json_files(out, RESULT_FILE).items()
        if RESULT_FOLDER.match(name)
    }


def read_results(out: str) -> dict[int, Condensation]:
    """Every checkpoint's analysis stored in ``out``, by step."""
    steps = {int(m.group(1)): r for name, r in read_analyses(out).items() if (m := STEP_FOLDER.match(name))}
    return dict(sorted(steps.items()))


def layer_row(result: Condensation, layer: LayerCondensation) -> dict:
    """One layer's numbers, as ``summary.csv`` and ``compare_layers.csv`` give them."""
    return {
        "layer_index": layer.index,
        "layer": layer.name,
        "layer_fraction": layer_fraction(layer.index, len(result.layers)),
        "mean_cos": layer.mean_cos,
        "mean_cos_offdiag": layer.mean_cos_offdiag,
        "effective_rank": layer.effective_rank,
        "mev": layer.mev,
    }


def summary_rows(results: list[Condensation]) -> list[dict]:
    """One row per step (or revision) × layer."""
    return [
        {
            "step": result.step,
            **({"revision": result.revision} if result.model else {}),
            **layer_row(result, layer),
            "spearman": result.spearman,
            "kendall": result.kendall,
        }
        for result in results
        for layer in result.layers
    ]
