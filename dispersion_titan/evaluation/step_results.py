"""Per-step result files, ``OUT/step-N/results.json`` (lm-eval's results of the per-task calls merged,
plus our ``dispersion_titan`` entry), and the summary over steps."""

from __future__ import annotations

import os

from ..run_folder.outputs import check_format, read_step_files, write_csv, write_json
from .protocol import mean_accuracy, task_scores

RESULT_FILE = "results.json"
SUMMARY_FILE = "summary.csv"
OURS = "dispersion_titan"


def merge(merged: dict, result: dict) -> dict:
    """Fold one ``simple_evaluate`` result (one task or group) into ``merged``."""
    for key, value in result.items():
        if isinstance(value, dict) and key != "config":  # lm-eval's ``config`` describes the run: the last call's wins
            merged[key] = {**merged.get(key, {}), **value}
        else:
            merged[key] = value
    return merged


def write_result(out: str, step: int, result: dict) -> None:
    from lm_eval.utils import handle_non_serializable  # how lm-eval itself writes its results

    write_json(os.path.join(out, f"step-{step}", RESULT_FILE), result, default=handle_non_serializable)


def read_evaluations(out: str) -> dict[int, dict]:
    """Every step evaluated in ``out`` (``{}`` when there is none), by step; each of this ``FORMAT``."""
    results = read_step_files(out, RESULT_FILE)
    for step, result in results.items():
        check_format(result.get(OURS), os.path.join(out, f"step-{step}", RESULT_FILE))
    return results


def settings(result: dict) -> dict:
    return result[OURS]["settings"]


def result_scores(result: dict) -> dict[str, float]:
    return task_scores(result["results"], settings(result)["tasks"])


def write_summary(out: str, results: list[dict]) -> str:
    """One row per step; a column for every task any step was scored on."""
    rows = []
    for result in sorted(results, key=lambda r: r[OURS]["step"]):
        scores = result_scores(result)
        rows.append({"step": result[OURS]["step"], **scores, "mean_acc": mean_accuracy(scores)})
    tasks = dict.fromkeys(key for row in rows for key in row if key not in ("step", "mean_acc"))
    path = os.path.join(out, SUMMARY_FILE)
    write_csv(path, [{key: row.get(key) for key in ("step", *tasks, "mean_acc")} for row in rows])
    return path
