"""``evaluate table``: the paper's Table 2 over evaluated runs.

Runs are grouped into arms (one configuration, several seeds) by their ``run.json``
without the seed, or named ``ARM=RUN1,RUN2``. Each run contributes one checkpoint
(``--select``); per arm and task the table gives mean ± sample std over seeds, the
average accuracy (perplexity left out, as in the paper), the arms' average rank over the
accuracy columns, and Welch's t-test of the per-seed averages against the reference arm.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
from scipy import stats

from ..analysis.compare import dispersion_variant
from ..analysis.result_files import atomic_write, ensure_writable, find_results_folder, write_csv
from ..run_folder.checkpoints import load_run_metadata
from . import EvaluationError
from .arms import ArmRow, RunScores
from .figure import average_accuracy_figure
from .protocol import is_accuracy, mean_accuracy
from .step_results import OURS, RESULT_FILE, differences, read_evaluations, result_scores, settings


def evaluation_folder(run: str) -> str:
    """``run`` is an evaluation folder, or a dump folder holding ``evaluation/``."""
    if not os.path.isdir(run):
        raise EvaluationError(f"{run}: no such folder")
    folder = find_results_folder(run, "evaluation", RESULT_FILE)
    if folder is None:
        raise EvaluationError(f"{run}: no evaluations here or in {os.path.join(run, 'evaluation')} "
                              f"(run python -m dispersion_titan.evaluate {run} first)")
    return folder


def select(run: str, rule: str) -> RunScores:
    """The checkpoint ``rule`` picks: ``best`` (highest mean acc; the earliest of equals),
    ``last``, or ``step:N``."""
    results = read_evaluations(evaluation_folder(run))
    if rule == "last":
        result = results[max(results)]
    elif rule == "best":
        averages = {step: mean_accuracy(result_scores(result)) for step, result in results.items()}
        if None in averages.values():
            raise EvaluationError(f"--select best: {run} has evaluations without accuracy scores")
        result = results[max(averages, key=lambda step: (averages[step], -step))]
    else:
        step = int(rule.removeprefix("step:"))
        if step not in results:
            raise EvaluationError(f"--select: {run} has no evaluation of step {step} (have {sorted(results)})")
        result = results[step]
    return RunScores(run, result[OURS]["run"], result[OURS]["step"], result_scores(result), settings(result))


def _run_config(run: RunScores) -> dict:
    """What defines a configuration: the run's run.json but the seed."""
    return {key: value for key, value in load_run_metadata(run.dump).items() if key != "seed"}


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _auto_labels(groups: list[list[RunScores]]) -> list[str]:
    """Arms named by the settings in which they differ, e.g. ``variant=angular_spread, coeff=0.1``."""
    flat = [_flatten(_run_config(group[0])) for group in groups]
    differing = [key for key in flat[0] if len({json.dumps(f.get(key)) for f in flat}) > 1] if len(flat) > 1 else []
    if not differing:
        return [dispersion_variant(group[0].dump) or "runs" for group in groups]
    return [", ".join(f"{key.rsplit('.', 1)[-1]}={f.get(key)}" for key in differing) for f in flat]


def arms(specs: list[str], rule: str) -> dict[str, list[RunScores]]:
    """Arm name -> its runs' selected checkpoints, arms in the order first named."""
    groups: dict[tuple[str, str], list[RunScores]] = {}  # (explicit name, "") or ("", configuration)
    seen: set[str] = set()
    for spec in specs:
        name, _, runs = spec.partition("=") if "=" in spec else ("", "", spec)
        if "=" in spec and (not name or not runs):
            raise EvaluationError(f"{spec!r}: an arm is ARM=RUN1,RUN2,... with a name and at least one run")
        for run in runs.split(","):
            if os.path.abspath(run) in seen:
                raise EvaluationError(f"{run}: named twice")
            seen.add(os.path.abspath(run))
            scores = select(run, rule)
            key = (name, "") if name else ("", json.dumps(_run_config(scores), sort_keys=True))
            groups.setdefault(key, []).append(scores)
    grouped = [runs for (name, _), runs in groups.items() if not name]
    labels = iter(_auto_labels(grouped) if grouped else [])
    by_arm: dict[str, list[RunScores]] = {}
    for (name, _), runs in groups.items():
        label = name or next(labels)
        if label in by_arm:
            raise EvaluationError(f"arm {label!r}: named explicitly and also found by grouping; rename one")
        by_arm[label] = runs
    return by_arm


def _check_comparable(runs: list[RunScores]) -> None:
    first = runs[0]
    for other in runs[1:]:
        if other.settings != first.settings:
            raise EvaluationError(f"{other.run} was evaluated with other settings than {first.run} "
                                  f"({differences(first.settings, other.settings)}); evaluate both alike")


def _std(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else math.nan


def welch_p(values: list[float], reference: list[float]) -> float | None:
    """Welch's two-sided t-test; None when a side has fewer than two seeds or no spread."""
    if len(values) < 2 or len(reference) < 2:
        return None
    p = stats.ttest_ind(values, reference, equal_var=False).pvalue
    return None if math.isnan(p) else float(p)


def arm_rows(by_arm: dict[str, list[RunScores]], reference: str) -> tuple[list[str], list[ArmRow]]:
    """The table's columns (``task/metric``) and one row per arm."""
    columns = list(next(iter(by_arm.values()))[0].scores)
    accuracy = [c for c in columns if is_accuracy(c)]
    if not accuracy:
        raise EvaluationError("the evaluations have no accuracy scores to tabulate")
    means = {arm: {c: float(np.mean([r.scores[c] for r in runs])) for c in columns} for arm, runs in by_arm.items()}
    ranks = np.array([stats.rankdata([-means[arm][c] for arm in by_arm]) for c in accuracy]).mean(axis=0)
    reference_averages = [r.average for r in by_arm[reference]]
    rows = []
    for (arm, runs), rank in zip(by_arm.items(), ranks, strict=True):
        averages = [r.average for r in runs]
        rows.append(ArmRow(
            name=arm, runs=runs, mean=means[arm], std={c: _std([r.scores[c] for r in runs]) for c in columns},
            average_mean=float(np.mean(averages)), average_std=_std(averages), rank=float(rank),
            p_value=None if arm == reference else welch_p(averages, reference_averages),
        ))
    return columns, rows


def _cell(mean: float, std: float, column: str) -> str:
    digits = 4 if is_accuracy(column) or column == "average" else 2
    return f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def markdown(columns: list[str], rows: list[ArmRow], reference: str, rule: str) -> str:
    header = ["arm", "seeds", *columns, "average", "avg rank", f"p vs {reference}", "sig"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.name, str(len(row.runs)), *(_cell(row.mean[c], row.std[c], c) for c in columns),
                 _cell(row.average_mean, row.average_std, "average"), f"{row.rank:.2f}",
                 "" if row.p_value is None else f"{row.p_value:.4f}", row.significance]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Mean ± sample std over seeds. Checkpoint per run: {rule}. The average and the rank (1 = best) "
              "are over the accuracy columns only. p: Welch's t-test of the per-seed averages against "
              f"{reference} (needs two seeds a side); * p<0.05, ** p<0.01, *** p<0.001.", "", "| arm | run | step | average |", "|---|---|---|---|"]
    lines += [f"| {row.name} | {r.run} | {r.step} | {r.average:.4f} |" for row in rows for r in row.runs]
    return "\n".join(lines) + "\n"


def csv_rows(columns: list[str], rows: list[ArmRow], reference: str) -> list[dict]:
    return [{
        "arm": row.name,
        "seeds": len(row.runs),
        "runs": ";".join(r.run for r in row.runs),
        "steps": ";".join(str(r.step) for r in row.runs),
        **{f"{c}_{kind}": getattr(row, kind)[c] for c in columns for kind in ("mean", "std")},
        "average_mean": row.average_mean,
        "average_std": row.average_std,
        "avg_rank": row.rank,
        "reference": reference,
        "p_value": row.p_value,
        "significance": row.significance,
    } for row in rows]


def table(specs: list[str], out: str, rule: str, reference: str | None) -> str:
    """Write ``table.md``, ``table.csv`` and ``table.png``; return the Markdown table."""
    by_arm = arms(specs, rule)
    reference = reference or next(iter(by_arm))
    if reference not in by_arm:
        raise EvaluationError(f"--reference: no arm {reference!r} (have {', '.join(map(repr, by_arm))})")
    _check_comparable([r for runs in by_arm.values() for r in runs])
    columns, rows = arm_rows(by_arm, reference)
    ensure_writable(out, "--out")
    text = markdown(columns, rows, reference, rule)
    atomic_write(os.path.join(out, "table.md"), lambda f: f.write(text))
    write_csv(os.path.join(out, "table.csv"), csv_rows(columns, rows, reference))
    average_accuracy_figure(rows, reference, sum(map(is_accuracy, columns)), rule, os.path.join(out, "table.png"))
    return text
