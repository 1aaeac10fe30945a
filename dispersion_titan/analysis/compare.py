"""``analyze compare RUN_A RUN_B … --out DIR``: several runs' condensation side by side, analyses of the
same token sequences only; each run labelled by folder, MLP width and dispersion variant."""

from __future__ import annotations

import os
import shlex
from typing import NamedTuple

import numpy as np

from ..run_folder.checkpoints import dispersion_variant
from ..run_folder.outputs import format_table, revision_folder, save_png, write_csv
from ..run_folder.owners import COMPARISON, relocated, results_folder, results_run, rewritten
from ..utils.errors import AnalysisError
from . import figures
from .condensation_schema import RESULT_FILE, Condensation, read_analyses
from .inputs import differences
from .statistics import layer_row


class RunResult(NamedTuple):  # the (label, result) pairs figures.comparison draws
    label: str
    result: Condensation


def analyses_folder(run: str) -> str:
    """``run``: a condensation folder, or a dump folder holding ``condensation/``."""
    return results_folder(run, "condensation", RESULT_FILE, "condensation analyses", "analyze")


def pick(run: str, step: str, option: str = "--step") -> Condensation:
    """``run``'s analysis at ``step``: a step number, a revision name (``default``: the default revision, as its
    folder ``rev-default`` is named), or ``last``."""
    results = list(read_analyses(analyses_folder(run)).values())
    if step == "last":
        return current(run, max(results, key=lambda r: r.step))
    for result in results:
        if result.model is None and step.isdigit() and result.step == int(step):
            return current(run, result)
        if result.model is not None and revision_folder(result.revision) == revision_folder(step):
            return current(run, result)
    if results[0].model is None:
        have = sorted(r.step for r in results)
        if not step:  # ``--step ''``, ``RUN@``: was "no analysis of step  (have …)"
            raise AnalysisError(f"{option}: empty; name a step of {run} (have {have})")
        raise AnalysisError(f"{option}: {run} has no analysis of step {step} (have {have})")
    have = [r.revision or "default" for r in results]
    raise AnalysisError(f"{option}: {run} has no analysis of revision {step} (have {have})")


def current(run: str, result: Condensation) -> Condensation:
    """``result``, once its checkpoint (found relative to its run, which may have moved since) still holds the
    weights it measured, as ``evaluate table`` checks its results; a Hugging Face model's local folder likewise (a hub
    model's is taken as it was)."""
    folder = analyses_folder(run)
    if result.model is None:
        dump = results_run(folder, result.run)
        what, here, again = f"step {result.step}", relocated(result.checkpoint, result.run, dump), "checkpoint"
        command = [dump, "--steps", str(result.step)]
    else:
        what, here, again = revision_folder(result.revision), result.checkpoint, "model"
        command = [f"hf:{result.model}" + (f"@{result.revision}" if result.revision else "")]
    if result.changed(here):  # the command names the options it records: measured again, it is measured alike
        inputs = {key: value for key, value in result.inputs.items() if key != "tokens_sha256" and value is not None}
        options = {**inputs, "dtype": result.dtype, "geometry_sequences": result.geometry_sequences}
        recorded = [arg for key, value in options.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
        raise AnalysisError(
            f"{folder}: {what} was analyzed from another {again} than {here} holds now (saved again or replaced "
            f"since); analyze it again with python -m dispersion_titan.analyze {shlex.join(command)} --out "
            f"{shlex.quote(folder)} --force {shlex.join(recorded)}"
        )
    return result


def load_runs(runs: list[str], step: str) -> list[RunResult]:
    """Each run's analysis at ``step``; refuses a run named twice, and analyses of different sequences or
    depth-trend points (``--layer-points``: Spearman and Kendall over other layers)."""
    named: dict[str, str] = {}
    for run in runs:
        folder = os.path.realpath(analyses_folder(run))
        if folder in named:
            raise AnalysisError(
                f"compare: {named[folder]} and {run} are the same run's analyses ({folder}); name each run once"
            )
        named[folder] = run
    results = [pick(run, step) for run in runs]
    for run, result in zip(runs[1:], results[1:]):
        points = [r.inputs["layer_points"] for r in (results[0], result)]
        if result.tokens_sha256 != results[0].tokens_sha256 or points[0] != points[1]:
            raise AnalysisError(
                f"compare: {run} was analyzed with different inputs than {runs[0]} "
                f"({differences(results[0].inputs, result.inputs)}); re-analyze with the same options"
            )
    dumps = [results_run(analyses_folder(run), result.run) for run, result in zip(runs, results, strict=True)]
    names = [os.path.basename(os.path.normpath(dump)) for dump in dumps]
    if len(set(names)) < len(names):  # same folder names in different places
        names = runs
    variants = map(dispersion_variant, dumps)
    return [
        RunResult(f"{name} (mlp {result.mlp_width}{f', dispersion {variant}' if variant else ''})", result)
        for result, name, variant in zip(results, names, variants, strict=True)
    ]


def table_rows(runs: list[RunResult]) -> list[dict]:
    """One row per run: the depth trend, the curve's ends, and the last block's geometry."""
    return [
        {
            "run": run.label,
            "step": run.result.step,
            "dtype": run.result.dtype,
            "layers": len(run.result.layers),
            "mlp_hidden_dim": run.result.mlp_width,
            "mean_cos_embedding": run.result.curve[0],
            "mean_cos_last_block": run.result.curve[-2],
            "mean_cos_final_norm": run.result.curve[-1],
            "mean_cos_all_layers": float(np.mean(run.result.curve)),
            "spearman": run.result.spearman,
            "kendall": run.result.kendall,
            "effective_rank_last_block": run.result.layers[-2].effective_rank,
            "mev_last_block": run.result.layers[-2].mev,
        }
        for run in runs
    ]


def steps_title(runs: list[RunResult]) -> str:
    """What is compared: ``step 4``, ``step 4 / step 8`` when runs end apart, or revision names."""
    return " / ".join(sorted({r.result.label for r in runs}))


def compare(runs: list[str], out: str, step: str) -> str:
    """Write ``compare.csv``, ``compare_layers.csv`` and ``compare.png``; return the table."""
    loaded = load_runs(runs, step)
    rows = table_rows(loaded)
    inputs = loaded[0].result.inputs
    title = f"{steps_title(loaded)}: K={inputs['num_sequences']}, S={inputs['seq_len']}"
    files = ("compare.csv", "compare_layers.csv", "compare.png")
    with rewritten(out, COMPARISON, files) as staging:
        write_csv(os.path.join(staging, "compare.csv"), rows)
        layers = [
            {"run": r.label, "step": r.result.step, **layer_row(r.result, x)} for r in loaded for x in r.result.layers
        ]
        # one row per run × layer, for plotting elsewhere
        write_csv(os.path.join(staging, "compare_layers.csv"), layers)
        save_png(figures.comparison(loaded, title), os.path.join(staging, "compare.png"))
    return format_table(rows)
