"""``evaluate table``: the paper's Table 2 over evaluated runs, grouped into arms (one configuration,
several seeds) by their ``run.json`` without the seed, or named ``ARM=RUN1,RUN2``; one checkpoint per
run (``--select``), a Pretrained row above the arms. The options' help says how each is chosen.
Written as ``table.md``, ``table.csv`` and ``table.png`` (the headline: average accuracy per arm).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import warnings
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import stats

from ..config.grid import Arm
from ..run_folder.checkpoints import LEDGER_KEYS, complete_checkpoints, load_run_metadata
from ..run_folder.outputs import atomic_write, headless_pyplot, save_png, write_csv
from ..run_folder.owners import RUN_ID, TABLE, relocated, results_folder, results_run, rewritten, run_paths
from ..run_folder.settings import from_scratch, trajectory_settings
from ..utils.errors import EvaluationError
from ..utils.hub import PREFIX
from ..utils.records import differences, flatten
from .protocol import BEST_STEP, TESTS, is_accuracy, mean_accuracy
from .runner import OURS, RESULT_FILE, comparable, read_evaluations, result_scores, settings, source_changed

plt = headless_pyplot()

SIGNIFICANCE = ((0.001, "***"), (0.01, "**"), (0.05, "*"))


@dataclass(frozen=True)
class Selection:
    """``--select`` and, for ``best``, the authors' evaluation cadence."""

    rule: str  # best | last | step:N
    num_ckpt: int | None  # the authors' --num_ckpt (None: their default for the run's start)
    exclude_initial: bool  # step 0 is no candidate for best
    best_step: str  # one of protocol.BEST_STEP

    def __post_init__(self) -> None:
        given = {
            "--num-ckpt": self.num_ckpt,
            "--best-step": self.best_step != "auto",
            "--exclude-initial": self.exclude_initial,
        }
        option = next((name for name, value in given.items() if value), None)
        if self.rule != "best" and option:  # was ignored, silently
            raise EvaluationError(
                f"{option}: chooses among the steps of --select best, and --select is {self.rule}; drop it, or use "
                "--select best"
            )

    def __str__(self) -> str:
        if self.rule != "best":
            return self.rule
        k = self.num_ckpt or f"{MIDTRAIN_NUM_CKPT} mid-training, {SCRATCH_NUM_CKPT} from scratch"
        return (
            f"best of the steps the authors evaluate (every floor(T/K)+1 steps, K = {k}, and the last"
            f"{'' if self.exclude_initial else ', and step 0 where evaluated'}; {BEST_STEP[self.best_step]})"
        )


PRETRAINED = "Pretrained"
MIDTRAIN_NUM_CKPT, SCRATCH_NUM_CKPT = 5, 2
"""``--num_ckpt``'s defaults in the authors' midtrain_gpt2.py / midtrain_qwen3.py and pretrain_toy_gpt2.py."""


def authors_steps(training_steps: int, num_ckpt: int = 5, include_initial: bool = False) -> set[int]:
    """The steps at which the authors' LMEvalCallback evaluates a run of ``training_steps`` steps."""
    every = training_steps // num_ckpt + 1
    return {*range(every, training_steps + 1, every), training_steps, *([0] if include_initial else [])}


@dataclass(frozen=True)
class RunScores:
    """One run's selected checkpoint."""

    run: str
    step: int
    scores: dict[str, float]
    settings: dict

    @property
    def average(self) -> float:
        return mean_accuracy(self.scores)


@dataclass(frozen=True)
class ArmRow:
    """``mean`` and ``std`` over seeds of each column and of the per-seed averages (``"average"``)."""

    name: str
    runs: list[RunScores]
    mean: dict[str, float]
    std: dict[str, float]
    rank: float
    p_value: float | None

    @property
    def significance(self) -> str:
        return next((stars for level, stars in SIGNIFICANCE if self.p_value is not None and self.p_value < level), "")


@dataclass(frozen=True)
class Evaluated:
    """One run's evaluations, read once, and its ``run.json``, once asked for (an ``hf:`` model has none)."""

    run: str
    folder: str
    results: dict[int, dict]

    @cached_property
    def dump(self) -> str:
        """The run evaluated, where it is now."""
        return results_run(self.folder, next(iter(self.results.values()))[OURS]["run"])

    @cached_property
    def metadata(self) -> dict:
        if not os.path.isdir(self.dump):  # an evaluation --out elsewhere outlives its run
            raise EvaluationError(
                f"{self.run}: the evaluation of {self.dump}, which is gone; the table reads the run's arm, seed and "
                f"steps from its run.json: put the run back there, or leave {self.run} out"
            )
        return load_run_metadata(self.dump)


def evaluated(run: str) -> Evaluated:
    """``run``'s evaluations: those of an evaluation folder, or of a dump folder's ``evaluation/``."""
    folder = results_folder(run, "evaluation", RESULT_FILE, "evaluations", "evaluate")
    return Evaluated(run, folder, read_evaluations(folder))


def _check_alike(labelled: list[tuple[str, dict]], remedy: str) -> None:
    """Refuse to weigh against each other results of other settings; ``labelled``: (what it is, its settings)."""
    (first, alike), *others = [(label, comparable(settings)) for label, settings in labelled]
    for other, theirs in others:
        if theirs != alike:
            raise EvaluationError(
                f"{other} was evaluated with other settings than {first} ({differences(alike, theirs)}); {remedy}"
            )


def _candidates(run: Evaluated, selection: Selection) -> dict[int, float]:
    """``--select best``: the mean accuracy of each of the run's evaluations at a step the authors evaluate."""
    num_ckpt = selection.num_ckpt or (SCRATCH_NUM_CKPT if from_scratch(run.metadata) else MIDTRAIN_NUM_CKPT)
    last = run.metadata["training_steps"]
    wanted = authors_steps(last, num_ckpt, not selection.exclude_initial)
    averages = {step: mean_accuracy(result_scores(r)) for step, r in run.results.items() if step in wanted}
    if not averages:
        raise EvaluationError(
            f"--select best: {run.run} has no evaluation of the steps the authors evaluate "
            f"({sorted(wanted)}; have {sorted(run.results)}); evaluate those steps "
            "(--steps), or use --select last or step:N"
        )
    _check_alike(
        [(f"{run.folder} step {s}", settings(run.results[s])) for s in sorted(averages)],
        "--select best weighs them together: evaluate them alike (python -m dispersion_titan.evaluate RUN --force "
        "with one set of settings), or use --select step:N",
    )
    if None in averages.values():
        raise EvaluationError(f"--select best: {run.run} has evaluations without accuracy scores")
    missing = wanted - {0} - set(run.results)  # step 0: where evaluated
    saved = {c.step for c in complete_checkpoints(run_paths(run.dump)["checkpoint.folder"])} if missing else set()
    if saved and max(saved) < last:  # the best of the steps it has reached so far
        raise EvaluationError(
            f"--select best: {run.run} has saved up to step {max(saved)} of its {last} (still training, or stopped); "
            "finish its training and evaluate the rest, or use --select last or step:N"
        )
    unevaluated = sorted(missing & saved)
    if unevaluated:  # evaluated while it trained, or an evaluation cut short: the best of some of them
        raise EvaluationError(
            f"--select best: {run.run} saved step {', '.join(map(str, unevaluated))}, which the authors evaluate, "
            f"and has no evaluation of it (have {sorted(run.results)}); evaluate it (python -m "
            f"dispersion_titan.evaluate {shlex.quote(run.dump)} --steps {','.join(map(str, unevaluated))}, with "
            "the others' settings), or use --select last or step:N"
        )
    return averages


def _best(curve: dict[int, float]) -> int:
    """The step of the highest value, the earliest of equals."""
    return max(curve, key=lambda step: (curve[step], -step))


def _chosen(run: Evaluated, step: int, weighed: list[int]) -> RunScores:
    """``step``'s scores, once each result the rule weighed still describes its checkpoint (found relative to
    its run, which may have moved since)."""
    for ours in (run.results[weighed_step][OURS] for weighed_step in weighed):
        if ours["run"].startswith(PREFIX):  # a Hugging Face model, evaluated as published
            here, target = ours["checkpoint"], ours["run"]
        else:
            here = relocated(ours["checkpoint"], ours["run"], run.dump)
            target = run.dump
        if source_changed(ours, here):
            raise EvaluationError(
                f"{run.folder}: step {ours['step']} was evaluated from another checkpoint than {here} "
                "holds now (saved again or replaced since); evaluate it again with "
                f"python -m dispersion_titan.evaluate {shlex.quote(target)} --out {shlex.quote(run.folder)} --force"
            )
    result = run.results[step]
    return RunScores(run.run, step, result_scores(result), settings(result))


def _at_step(runs: list[Evaluated], step: int, option: str) -> list[RunScores]:
    """Each run's scores at ``step``, which ``option`` asked for of every run."""
    if missing := next((run for run in runs if step not in run.results), None):
        raise EvaluationError(
            f"{option}: {missing.run} has no evaluation of step {step} (have {sorted(missing.results)})"
        )
    return [_chosen(run, step, [step]) for run in runs]


def select_arm(runs: list[Evaluated], selection: Selection) -> list[RunScores]:
    """One checkpoint per run of an arm: ``last``, ``step:N`` or ``best`` (the earliest of equals), per seed or on
    the seed-averaged curve (``--best-step``)."""
    rule = selection.rule
    if rule == "last":
        return [_chosen(run, max(run.results), [max(run.results)]) for run in runs]
    if rule != "best":
        return _at_step(runs, int(rule.removeprefix("step:")), "--select")
    per_run = [_candidates(run, selection) for run in runs]
    averaged = selection.best_step == "averaged" or (selection.best_step == "auto" and from_scratch(runs[0].metadata))
    if not averaged:
        return [_chosen(run, _best(c), list(c)) for run, c in zip(runs, per_run, strict=True)]
    curve = {
        step: float(np.mean([c[step] for c in per_run if step in c]))
        for step in sorted({step for c in per_run for step in c})
    }
    best = _best(curve)
    if lacking := [run.run for run, c in zip(runs, per_run, strict=True) if best not in c]:
        raise EvaluationError(
            f"--select best: {lacking[0]} has no evaluation of step {best}, the best on its arm's "
            "seed-averaged curve; evaluate it (--steps), or use --best-step per-seed"
        )
    return [_chosen(run, best, list(c)) for run, c in zip(runs, per_run, strict=True)]


RECORDED_APART = (
    "debug.seed",
    "training.steps",
    "model.",
    "dispersion.",
    "baseline.",
    "optimizer.baseline.",
    "lr_scheduler.baseline.",
)
"""Settings that differ between the seeds of a configuration, or that run.json records apart (``training_steps``,
``model_args``, ...), where a resumed run's may differ from its first launch's."""


def _run_config(metadata: dict) -> dict:
    """What defines a configuration: the run's run.json but the seed, its identity and place (``run_id``, its
    outside folders' ``paths``: each run its own) and its launch record, and the settings that fix what it
    computes (its learning rate, data, ...: runs of other ones are no seeds of one arm)."""
    settings = trajectory_settings(metadata.get("settings") or {})
    return {
        **{key: value for key, value in metadata.items() if key not in ("seed", RUN_ID, "paths", *LEDGER_KEYS)},
        "settings": {key: value for key, value in settings.items() if not key.startswith(RECORDED_APART)},
    }


def _arm(metadata: dict) -> Arm:
    dispersion, baseline = metadata.get("dispersion") or {}, metadata.get("baseline") or {}
    return Arm(dispersion.get("variant", "none"), dispersion.get("coeff") or 0.0, baseline.get("method", "none"))


def _auto_labels(groups: list[list[Evaluated]]) -> list[str]:
    """Arms named by the settings in which they differ, e.g. ``variant=angular_spread, coeff=0.1``."""
    flat = [flatten(_run_config(group[0].metadata)) for group in groups]
    differing = [key for key in flat[0] if len({json.dumps(f.get(key)) for f in flat}) > 1] if len(flat) > 1 else []
    if not differing:  # one arm: named as the sweep names its cells (``baseline``, ``angular_spread-c0.1``)
        return [_arm(group[0].metadata).label for group in groups]
    return [", ".join(f"{key.rsplit('.', 1)[-1]}={f.get(key)}" for key in differing) for f in flat]


def arm_runs(spec: str) -> tuple[str, list[str]]:
    """``[ARM=]RUN1,RUN2,...``: the arm's name ("": its runs grouped by configuration) and its runs; a folder
    of that name is one run (``lr=1e-3_s1``, ``a,b``), not an arm."""
    if os.path.isdir(spec):
        return "", [spec]
    name, _, runs = spec.partition("=") if "=" in spec else ("", "", spec)
    if "=" in spec and not name.strip() or "" in runs.split(","):  # a blank name: a row without a label
        raise EvaluationError(f"{spec!r}: give [ARM=]RUN1,RUN2,..., a name before = and no empty run")
    return name, runs.split(",")


def one_seed_each(runs: list[tuple[str, dict]]) -> None:
    """Refuse one seed of a configuration counted twice: a run named twice, its ``cp -a`` copy or a rerun with the
    same settings and seed; ``runs``: each run as named, and its ``run.json``."""
    seeds: dict[str, str] = {}  # a configuration with its seed -> its run
    for run, metadata in runs:
        seeded = json.dumps([_run_config(metadata), metadata.get("seed")], sort_keys=True)
        if seeded in seeds:
            raise EvaluationError(
                f"{run}: the same settings and seed as {seeds[seeded]} (named twice, a copy or a rerun), not "
                "another seed; name one of them, or train the other with another --debug.seed"
            )
        seeds[seeded] = run


def evaluated_arms(specs: list[str]) -> dict[str, list[Evaluated]]:
    """Arm name -> its runs' evaluations, arms in the order first named."""
    arms = list(map(arm_runs, specs))
    names = [name for name, _ in arms if name]
    if twice := next((name for name in names if names.count(name) > 1), None):  # was: merged into one arm
        raise EvaluationError(f"arm {twice!r}: named twice; give its runs once ({twice}=RUN1,RUN2,...), or rename one")
    found = [(name, evaluated(run)) for name, runs in arms for run in runs]
    one_seed_each([(run.run, run.metadata) for _, run in found])
    groups: dict[tuple[str, str], list[Evaluated]] = {}  # (explicit name, "") or ("", configuration)
    for name, run in found:
        key = (name, "") if name else ("", json.dumps(_run_config(run.metadata), sort_keys=True))
        groups.setdefault(key, []).append(run)
    labels = iter(_auto_labels([runs for (name, _), runs in groups.items() if not name]))
    by_arm: dict[str, list[Evaluated]] = {}
    for (name, _), runs in groups.items():
        label = name or next(labels)
        if label in by_arm or label == PRETRAINED:
            raise EvaluationError(
                f"arm {label!r}: named explicitly and also found by grouping (or named "
                f"{PRETRAINED}, the table's own row); rename one"
            )
        by_arm[label] = runs
    return by_arm


def t_test_p(values: list[float], reference: list[float], test: str) -> float | None:
    """The two-sided t-test (``student``: equal variances; ``welch``); None without two seeds or spread."""
    if len(values) < 2 or len(reference) < 2 or len({*values}) == len({*reference}) == 1:
        return None  # no spread on either side: scipy says p = 0 for any two means
    with warnings.catch_warnings():  # scipy's "precision loss" for one side's equal seeds, exact here
        warnings.simplefilter("ignore", RuntimeWarning)
        p = stats.ttest_ind(values, reference, equal_var=test == "student").pvalue
    return None if math.isnan(p) else float(p)


def _dispersion(run: Evaluated) -> str | None:
    """The variant of the run's dispersion loss; None when it trains without one."""
    arm = _arm(run.metadata)
    return arm.name if arm.name != "none" and arm.coeff > 0 else None


REFERENCE_VARIANT = "angular_spread"
"""The paper's reference row: the dispersion loss it proposes."""


def default_reference(by_arm: dict[str, list[Evaluated]]) -> tuple[str, str]:
    """The arm the others are tested against, and why."""
    for arm, runs in by_arm.items():
        if _dispersion(runs[0]) == REFERENCE_VARIANT:
            return arm, f"its runs train with {REFERENCE_VARIANT}, the paper's reference row"
    for arm, runs in by_arm.items():
        if _dispersion(runs[0]) is not None:
            return arm, f"no arm trains with {REFERENCE_VARIANT}; the first arm with a dispersion loss"
    return next(iter(by_arm)), "no arm trains with a dispersion loss; the first arm"


def pretrained_scores(found: dict[str, list[Evaluated]], spec: str) -> tuple[list[RunScores], str]:
    """The Pretrained row's runs at step 0 (``--pretrained``) and a line saying what they are."""
    if spec == "none":
        return [], "No Pretrained row (--pretrained none)."
    if spec == "auto":
        arm = next((arm for arm, runs in found.items() if _dispersion(runs[0]) is None), None)
        if arm is not None and from_scratch(found[arm][0].metadata):
            return [], f"No Pretrained row: {arm} trains from scratch (--pretrained RUN names a model before training)."
        runs = [run for run in found[arm] if 0 in run.results] if arm is not None else []
        if not runs:
            where = f"the runs of {arm} have no evaluation of step 0" if arm else "every arm uses a dispersion loss"
            return [], (
                f"No Pretrained row: {where} (evaluate --steps 0 adds it, or --pretrained RUN names the "
                "model before training)."
            )
        return _at_step(runs, 0, "--pretrained"), f"Pretrained: step 0 (before mid-training) of {arm}'s runs."
    if spec.startswith(PREFIX):
        raise EvaluationError(
            f"--pretrained: {spec} is a model, not its evaluation: evaluate it first "
            f"(python -m dispersion_titan.evaluate {shlex.quote(spec)} --out DIR), then --pretrained DIR"
        )
    if "" in spec.split(","):  # an unset $VAR (was: ': no such folder')
        raise EvaluationError(f"--pretrained: {spec!r}: give auto, none or RUN1,RUN2,..., no empty run")
    runs = [evaluated(run) for run in spec.split(",")]
    folders = [os.path.realpath(run.folder) for run in runs]
    if twice := next((run for run, folder in zip(runs, folders) if folders.count(folder) > 1), None):
        raise EvaluationError(  # was: one result counted as two seeds, its std 0 and its p-value of a duplicate
            f"--pretrained: {spec!r} names {twice.folder} twice (a link, or a run and its evaluation); name it once"
        )
    return _at_step(runs, 0, "--pretrained"), f"Pretrained: step 0 of {', '.join(run.run for run in runs)}."


DIGITS = 4
"""Digits of the printed accuracy cells (the paper's percentages to 2 decimals); ranks are taken on them."""


def min_ranks(means: list[dict[str, float]], accuracy: list[str]) -> list[float]:
    """The paper's ranks: per accuracy column on the means as printed, ties the smallest, averaged."""
    per_column = [stats.rankdata([-round(m[c], DIGITS) for m in means], method="min") for c in accuracy]
    return [float(r) for r in np.mean(per_column, axis=0)]


def table_rows(
    by_arm: dict[str, list[RunScores]], reference: str, test: str, pretrained: list[RunScores]
) -> tuple[list[str], list[ArmRow], ArmRow | None]:
    """The columns (``task/metric``), the arms' rows and the Pretrained row (None: none), ranked together."""
    named = {**({PRETRAINED: pretrained} if pretrained else {}), **by_arm}
    first = next(iter(named.values()))[0]
    columns = list(first.scores)
    other = next((run for runs in named.values() for run in runs if set(run.scores) != set(columns)), None)
    if other is not None:  # a task lm-eval did not score, or a results.json edited by hand
        raise EvaluationError(
            f"{other.run}: step {other.step}'s scores are not of the columns of {first.run} step {first.step} "
            f"({', '.join(sorted(set(other.scores) ^ set(columns)))}); evaluate that step again "
            f"(evaluate --steps {other.step} --force), or leave the run out"
        )
    accuracy = [c for c in columns if is_accuracy(c)]
    if not accuracy:
        raise EvaluationError("the evaluations have no accuracy scores to tabulate")
    seeds = {
        name: {**{c: [r.scores[c] for r in runs] for c in columns}, "average": [r.average for r in runs]}
        for name, runs in named.items()
    }
    means = {name: {key: float(np.mean(values)) for key, values in by_key.items()} for name, by_key in seeds.items()}
    rows = {
        name: ArmRow(
            name,
            runs,
            means[name],
            {key: np.std(values, ddof=1) if len(values) > 1 else math.nan for key, values in seeds[name].items()},
            rank,
            None if name == reference else t_test_p(seeds[name]["average"], seeds[reference]["average"], test),
        )
        for (name, runs), rank in zip(named.items(), min_ranks(list(means.values()), accuracy), strict=True)
    }
    base = rows.pop(PRETRAINED, None)
    return columns, list(rows.values()), base


def difference(row: ArmRow, pretrained: ArmRow | None) -> dict[str, float | None]:
    """The row's means minus the Pretrained row's (the authors' second line of each row)."""
    return {key: None if pretrained is None else mean - pretrained.mean[key] for key, mean in row.mean.items()}


def _digits(column: str) -> int:
    return DIGITS if is_accuracy(column) or column == "average" else 2


def cell(mean: float, std: float, column: str) -> str:
    """``mean ± std`` as printed; no ± for one seed."""
    return f"{mean:.{_digits(column)}f}" + ("" if math.isnan(std) else f" ± {std:.{_digits(column)}f}")


def row_cells(row: ArmRow) -> list[str]:
    """The row's arm, seeds and ``mean ± std`` cells, as each of its tables prints them."""
    return [row.name, str(len(row.runs)), *(cell(row.mean[key], row.std[key], key) for key in row.mean)]


def difference_cells(row: ArmRow, pretrained: ArmRow) -> list[str]:
    """The row's ``difference`` from the Pretrained row, signed, as each of its tables prints it."""
    return [f"{value:+.{_digits(key)}f}" for key, value in difference(row, pretrained).items()]


def table_markdown(
    columns: list[str],
    rows: list[ArmRow],
    reference: str,
    selection: Selection,
    test: str,
    pretrained: ArmRow | None,
    pretrained_note: str,
    reference_note: str,
) -> str:
    everyone = ([pretrained] if pretrained else []) + rows
    header = ["arm", "seeds", *columns, "average", "avg rank", f"p vs {reference}", "sig"]
    lines = _markdown(
        header,
        [
            [*row_cells(row), f"{row.rank:.2f}", "" if row.p_value is None else f"{row.p_value:.4f}", row.significance]
            for row in everyone
        ],
    )
    lines += [
        "",
        f"Mean ± sample std over seeds. Checkpoint per run: {selection}. The average and the rank are over "
        f"the accuracy columns only; the rank is each row's per column (1 = best, every row ranked, "
        f"{PRETRAINED} included; ties share the smallest, on the means rounded to the {DIGITS} digits printed), "
        f"averaged, as the paper's. p: {TESTS[test]} t-test of the per-seed averages against {reference} "
        f"({reference_note}; needs two seeds a side, not all alike); * p<0.05, ** p<0.01, *** p<0.001. "
        f"{pretrained_note}",
    ]
    if pretrained and rows:  # alone, it has nothing to differ from
        diff_rows = [[row.name, *difference_cells(row, pretrained)] for row in rows]
        lines += ["", f"Difference from {PRETRAINED} (mean − {PRETRAINED}'s mean):", ""]
        lines += _markdown(["arm", *columns, "average"], diff_rows)
    runs = [[row.name, r.run, str(r.step), f"{r.average:.4f}"] for row in everyone for r in row.runs]
    return "\n".join([*lines, "", *_markdown(["arm", "run", "step", "average"], runs)]) + "\n"


def _markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; a ``|`` in a cell (an arm's name) escaped, not a column of its own."""

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", r"\|") for cell in cells) + " |"

    return [line(header), "|" + "---|" * len(header), *map(line, rows)]


def csv_rows(rows: list[ArmRow], reference: str, test: str, pretrained: ArmRow | None) -> list[dict]:
    """One line per row, the Pretrained row first; ``*_diff``: the difference from it."""
    return [
        {
            "arm": row.name,
            "seeds": len(row.runs),
            "runs": ";".join(r.run for r in row.runs),
            "steps": ";".join(str(r.step) for r in row.runs),
            **{f"{key}_{kind}": getattr(row, kind)[key] for key in row.mean for kind in ("mean", "std")},
            "avg_rank": row.rank,
            "reference": reference,
            "test": test,
            "p_value": row.p_value,
            "significance": row.significance,
            **{
                f"{key}_diff": value
                for key, value in difference(row, None if row is pretrained else pretrained).items()
            },
        }
        for row in ([pretrained] if pretrained else []) + rows
    ]


def average_accuracy_figure(rows: list[ArmRow], reference: str, tasks: int, rule: str, test: str, path: str) -> None:
    """Bars: mean over seeds with ± std error bars; dots: the seeds; stars: ``test`` (the
    t-test's name) against the reference arm (hatched)."""
    fig, ax = plt.subplots(figsize=(max(6.4, 1.6 * len(rows) + 2), 4.6), layout="constrained")
    x = np.arange(len(rows))
    means = [row.mean["average"] for row in rows]
    errors = [0 if np.isnan(row.std["average"]) else row.std["average"] for row in rows]
    hatches = ["//" if row.name == reference else None for row in rows]
    bars = ax.bar(x, means, yerr=errors, capsize=6, color="#8fb3d9", edgecolor="#1f4e79", width=0.6, hatch=hatches)
    ax.bar_label(bars, [row.significance for row in rows], padding=4, fontsize=12)  # above the error bar
    seeds = [
        (index + offset, run.average)
        for index, row in enumerate(rows)
        for offset, run in zip(np.linspace(-0.12, 0.12, len(row.runs)), row.runs, strict=True)
    ]
    ax.scatter(*zip(*seeds, strict=True), color="black", s=14, zorder=3, label="seeds")
    low, high = min(y for _, y in seeds), max(y for _, y in seeds)
    span = max(high - low, 0.01)
    ax.set_ylim(max(0.0, low - 0.6 * span), high + 0.6 * span)
    labels = [
        f"{row.name.replace(', ', chr(10))}\n({len(row.runs)} seed{'s' if len(row.runs) > 1 else ''})" for row in rows
    ]
    ax.set_xticks(x, labels, fontsize=9)
    ax.set_ylabel(f"average accuracy over {tasks} task{'s' if tasks > 1 else ''}")
    ax.set_title(
        f"Average accuracy per arm (checkpoint: {rule})\n"
        f"{test} t-test vs the hatched arm: * p<0.05, ** p<0.01, *** p<0.001",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    save_png(fig, path)


@dataclass(frozen=True)
class Table:
    """A table as written: its columns, arm rows, Pretrained row (None: none), reference arm and Markdown."""

    columns: list[str]
    rows: list[ArmRow]
    pretrained: ArmRow | None
    reference: str
    markdown: str


def table(specs: list[str], out: str, selection: Selection, reference: str | None, test: str, pretrained: str) -> Table:
    """Write ``table.md``, ``table.csv`` and ``table.png``; return the table."""
    found = evaluated_arms(specs)
    by_arm = {arm: select_arm(runs, selection) for arm, runs in found.items()}
    if reference is not None and reference not in by_arm:
        raise EvaluationError(f"--reference: no arm {reference!r} (have {', '.join(map(repr, by_arm))})")
    base, note = pretrained_scores(found, pretrained)
    if not by_arm and not base:
        raise EvaluationError("RUN: no runs to tabulate (or --pretrained FOLDER: the Pretrained row alone)")
    if reference:
        why = "given with --reference"
    else:  # a block of the paper's table without mid-trained arms (GPT2-large, -xl): its Pretrained row alone
        reference, why = default_reference(found) if by_arm else (PRETRAINED, "no arms: the Pretrained row alone")
    _check_alike([(r.run, r.settings) for runs in [*by_arm.values(), base] for r in runs], "evaluate both alike")
    columns, rows, base_row = table_rows(by_arm, reference, test, base)
    text = table_markdown(columns, rows, reference, selection, test, base_row, note, why)
    with rewritten(out, TABLE, ("table.md", "table.csv", "table.png")) as staging:
        atomic_write(os.path.join(staging, "table.md"), lambda f: f.write(text))
        write_csv(os.path.join(staging, "table.csv"), csv_rows(rows, reference, test, base_row))
        average_accuracy_figure(  # the arms; without any, the Pretrained row alone
            rows or [base_row],
            reference,
            sum(map(is_accuracy, columns)),
            selection.rule,
            TESTS[test],
            os.path.join(staging, "table.png"),
        )
    return Table(columns, rows, base_row, reference, text)
