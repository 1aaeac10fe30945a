"""``evaluate table``: the paper's Table 2 over evaluated runs.

Runs are grouped into arms (one configuration, several seeds) by their ``run.json``
without the seed, or named ``ARM=RUN1,RUN2``. Each run contributes one checkpoint
(``--select``; ``best`` among the steps the authors' LMEvalCallback evaluates); per arm
and task the table gives mean ± sample std over seeds, the average accuracy (perplexity
left out, as in the paper), the arms' average rank over the accuracy columns, and a
t-test of the per-seed averages against the reference arm (Student's, as the paper's
Table 2, by default; Welch's on request).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..analysis.compare import dispersion_variant
from ..analysis.result_files import atomic_write, ensure_writable, find_results_folder, write_csv
from ..run_folder.checkpoints import LEDGER_KEYS, identity_changed, load_run_metadata
from ..run_folder.writer_lock import sole_writer
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


TESTS = {"student": "Student's", "welch": "Welch's"}


@dataclass(frozen=True)
class Selection:
    """``--select`` and, for ``best``, the authors' evaluation cadence."""

    rule: str  # best | last | step:N
    num_ckpt: int = 5  # the authors' --num_ckpt: evaluations every floor(T / num_ckpt) + 1 steps
    include_initial: bool = False  # step 0 is a candidate for best (their --eval_at_begin)

    def __str__(self) -> str:
        if self.rule != "best":
            return self.rule
        return (f"best of the steps the authors evaluate (every floor(T/{self.num_ckpt})+1 steps and the last"
                f"{', and step 0' if self.include_initial else ''})")


def authors_steps(training_steps: int, num_ckpt: int = 5, include_initial: bool = False) -> set[int]:
    """The steps at which the authors' LMEvalCallback evaluates a run of ``training_steps``
    steps: every ``training_steps // num_ckpt + 1`` steps (``on_step_end``), the last step
    (``on_train_end``), and step 0 only with ``--eval_at_begin``."""
    every = training_steps // num_ckpt + 1
    return {*range(every, training_steps + 1, every), training_steps, *([0] if include_initial else [])}


def _training_steps(run: str, dump: str) -> int:
    steps = load_run_metadata(dump).get("training_steps")
    if not isinstance(steps, int):
        raise EvaluationError(f"--select best: {run}: {dump}/run.json records no training_steps (a run trained "
                              "before it was recorded); use --select last or step:N")
    return steps


def _check_fresh(folder: str, result: dict) -> None:
    """A result whose checkpoint now holds other weights (saved again or replaced since) is refused,
    never tabled in silence. The checkpoint is found relative to the run, so a moved run still counts."""
    ours = result[OURS]
    if ours.get("checkpoint") is None:  # written before results recorded their checkpoint
        return
    dump = os.path.dirname(folder) if os.path.basename(folder) == "evaluation" else ours["run"]
    here = os.path.join(dump, os.path.relpath(ours["checkpoint"], ours["run"]))
    if identity_changed(ours.get("checkpoint_identity"), here):
        raise EvaluationError(f"{folder}: step {ours['step']} was evaluated from another checkpoint than {here} "
                              "holds now (saved again or replaced since); evaluate it again with "
                              "python -m dispersion_titan.evaluate RUN --force")


def _check_alike(folder: str, weighed: list[dict]) -> None:
    """The results ``--select best`` weighs against each other were made with one set of
    settings, or it is refused in one line naming the steps of each and what differs."""
    groups: dict[str, tuple[dict, list[int]]] = {}  # the settings as JSON -> (the settings, their steps)
    for result in sorted(weighed, key=lambda r: r[OURS]["step"]):
        key = json.dumps(settings(result), sort_keys=True)
        groups.setdefault(key, (settings(result), []))[1].append(result[OURS]["step"])
    if len(groups) > 1:
        (first, first_steps), (other, other_steps) = list(groups.values())[:2]
        raise EvaluationError(
            f"--select best: {folder}: steps {first_steps} and {other_steps} were evaluated with other settings "
            f"({differences(first, other)}); results of other settings are not weighed "
            "together: evaluate them alike (python -m dispersion_titan.evaluate RUN --force with one set of "
            "settings), or use --select step:N"
        )


def select(run: str, selection: Selection) -> RunScores:
    """The checkpoint ``selection`` picks: ``best`` (highest mean acc among the authors'
    evaluated steps; the earliest of equals), ``last``, or ``step:N``; each result it weighs
    must still describe its checkpoint."""
    folder = evaluation_folder(run)
    results = read_evaluations(folder)
    rule = selection.rule
    if rule == "last":
        result = results[max(results)]
        weighed = [result]
    elif rule == "best":
        dump = next(iter(results.values()))[OURS]["run"]
        wanted = authors_steps(_training_steps(run, dump), selection.num_ckpt, selection.include_initial)
        candidates = {step: r for step, r in results.items() if step in wanted}
        if not candidates:
            raise EvaluationError(f"--select best: {run} has no evaluation of the steps the authors evaluate "
                                  f"({sorted(wanted)}; have {sorted(results)}); evaluate those steps "
                                  "(--steps), or use --select last or step:N")
        _check_alike(folder, list(candidates.values()))
        averages = {step: mean_accuracy(result_scores(r)) for step, r in candidates.items()}
        if None in averages.values():
            raise EvaluationError(f"--select best: {run} has evaluations without accuracy scores")
        result = candidates[max(averages, key=lambda step: (averages[step], -step))]
        weighed = list(candidates.values())
    else:
        step = int(rule.removeprefix("step:"))
        if step not in results:
            raise EvaluationError(f"--select: {run} has no evaluation of step {step} (have {sorted(results)})")
        result = results[step]
        weighed = [result]
    for weighed_result in weighed:  # each result the rule looked at, its checkpoint read once
        _check_fresh(folder, weighed_result)
    return RunScores(run, result[OURS]["run"], result[OURS]["step"], result_scores(result), settings(result))


def _run_config(run: RunScores) -> dict:
    """What defines a configuration: the run's run.json but the seed and its launch record."""
    return {key: value for key, value in load_run_metadata(run.dump).items() if key not in ("seed", *LEDGER_KEYS)}


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


def arms(specs: list[str], selection: Selection) -> dict[str, list[RunScores]]:
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
            scores = select(run, selection)
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


def t_test_p(values: list[float], reference: list[float], test: str) -> float | None:
    """The two-sided t-test (``student``: equal variances; ``welch``); None when a side
    has fewer than two seeds or there is no spread."""
    if len(values) < 2 or len(reference) < 2:
        return None
    p = stats.ttest_ind(values, reference, equal_var=test == "student").pvalue
    return None if math.isnan(p) else float(p)


def default_reference(by_arm: dict[str, list[RunScores]]) -> str:
    """The first arm whose runs train with a dispersion loss (the paper's reference row), else the first arm."""
    for arm, runs in by_arm.items():
        dispersion = load_run_metadata(runs[0].dump).get("dispersion") or {}
        if dispersion.get("variant", "none") != "none" and (dispersion.get("coeff") or 0) > 0:
            return arm
    return next(iter(by_arm))


def arm_rows(by_arm: dict[str, list[RunScores]], reference: str,
             test: str = "student") -> tuple[list[str], list[ArmRow]]:
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
            p_value=None if arm == reference else t_test_p(averages, reference_averages, test),
        ))
    return columns, rows


def _cell(mean: float, std: float, column: str) -> str:
    digits = 4 if is_accuracy(column) or column == "average" else 2
    return f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def markdown(columns: list[str], rows: list[ArmRow], reference: str, selection: Selection, test: str) -> str:
    header = ["arm", "seeds", *columns, "average", "avg rank", f"p vs {reference}", "sig"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.name, str(len(row.runs)), *(_cell(row.mean[c], row.std[c], c) for c in columns),
                 _cell(row.average_mean, row.average_std, "average"), f"{row.rank:.2f}",
                 "" if row.p_value is None else f"{row.p_value:.4f}", row.significance]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Mean ± sample std over seeds. Checkpoint per run: {selection}. The average and the rank "
              f"(1 = best) are over the accuracy columns only. p: {TESTS[test]} t-test of the per-seed averages "
              f"against {reference} (needs two seeds a side); * p<0.05, ** p<0.01, *** p<0.001.",
              "", "| arm | run | step | average |", "|---|---|---|---|"]
    lines += [f"| {row.name} | {r.run} | {r.step} | {r.average:.4f} |" for row in rows for r in row.runs]
    return "\n".join(lines) + "\n"


def csv_rows(columns: list[str], rows: list[ArmRow], reference: str, test: str) -> list[dict]:
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
        "test": test,
        "p_value": row.p_value,
        "significance": row.significance,
    } for row in rows]


def table(specs: list[str], out: str, selection: Selection, reference: str | None, test: str = "student") -> str:
    """Write ``table.md``, ``table.csv`` and ``table.png``; return the Markdown table."""
    by_arm = arms(specs, selection)
    if reference is not None and reference not in by_arm:
        raise EvaluationError(f"--reference: no arm {reference!r} (have {', '.join(map(repr, by_arm))})")
    reference = reference or default_reference(by_arm)
    _check_comparable([r for runs in by_arm.values() for r in runs])
    columns, rows = arm_rows(by_arm, reference, test)
    ensure_writable(out, "--out")
    text = markdown(columns, rows, reference, selection, test)
    with sole_writer(out):
        atomic_write(os.path.join(out, "table.md"), lambda f: f.write(text))
        write_csv(os.path.join(out, "table.csv"), csv_rows(columns, rows, reference, test))
        average_accuracy_figure(rows, reference, sum(map(is_accuracy, columns)), selection.rule, TESTS[test],
                                os.path.join(out, "table.png"))
    return text
