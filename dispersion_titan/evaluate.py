"""``python -m dispersion_titan.evaluate RUN|hf:MODEL`` (lm-eval) and its ``table`` command (the paper's
Table 2): arguments and dispatch. Checkpoints that cannot be read are reported and skipped (exit status 1)."""

from __future__ import annotations

import argparse
import os
import re
import sys

from dispersion_titan.config.cli import (
    OneLineErrorParser,
    add_device_arguments,
    add_results_arguments,
    named,
    named_out,
    non_negative_int,
    out_folder,
    positive_int,
)
from dispersion_titan.evaluation.protocol import AUTHORS_BATCH_SIZE, BEST_STEP, PRESETS, TESTS
from dispersion_titan.run_folder.outputs import REWRITTEN
from dispersion_titan.run_folder.owners import TABLE, owned
from dispersion_titan.utils.devices import AUTOCAST
from dispersion_titan.utils.errors import command, run_command

task_folder = named("a folder of lm-eval task YAMLs")


def task_limit(text: str) -> int | str:
    return text if text == "all" else positive_int(text)


def _selection(text: str) -> str:
    if text in ("best", "last") or re.fullmatch(r"step:\d+", text):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not best, last or step:N")


def evaluate_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.evaluate",
        description="lm-eval scores of a run's checkpoints (default: the authors' protocol for the run's "
        "model family).",
        epilog="The paper's Table 2 over runs: python -m dispersion_titan.evaluate table RUN... --out DIR",
    )
    p.add_argument(
        "run",
        metavar="RUN",
        type=named("a run folder, its checkpoint folder or hf:MODEL"),
        help="a run folder or its checkpoint folder; or hf:MODEL[@REV] (a hub id or Hugging Face "
        "folder, as published: step 0 of --out, which it needs)",
    )
    p.add_argument("--steps", default="all", help="all (default), or steps and ranges such as 0,5,10-20")
    p.add_argument(
        "--protocol",
        choices=PRESETS,
        help="the authors' tasks (10 accuracies, wikitext-103 perplexity), shots per task and limit "
        "(default: the run's family from its run.json: qwen3_dispersion runs qwen3, others gpt2): "
        + "; ".join(
            f"{name}: few-shot tasks {preset.few_shot} shot(s), the others 0, {preset.limit} per task"
            for name, preset in PRESETS.items()
        ),
    )
    p.add_argument("--tasks", help="comma-separated lm-eval task or group names (default: the protocol's)")
    p.add_argument(
        "--include-path",
        "--include_path",
        metavar="DIR",
        type=task_folder,
        help="folder of your own lm-eval task YAMLs",
    )
    p.add_argument("--limit", type=task_limit, help="examples per task, or all (default: the protocol's)")
    p.add_argument(
        "--num-fewshot",
        "--num_fewshot",
        type=non_negative_int,
        help="shots for every task (default: the protocol's per task, else the task's own)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=AUTHORS_BATCH_SIZE,
        help=f"lm-eval batch size (default {AUTHORS_BATCH_SIZE}, the authors'; larger batches pad, "
        "which moves log-likelihoods in their last digits)",
    )
    p.add_argument("--out", type=named_out, help="output folder (default: RUN/evaluation)")
    add_device_arguments(
        p,
        dtype_help="fp32 (default), bf16 weights, or autocast: fp32 weights under bf16 autocast, as the authors' "
        "in-training evaluation (accelerate's bf16=True)",
        dtypes=("fp32", "bf16", AUTOCAST),
    )
    add_results_arguments(p, "evaluate", "scores")
    return p


def table_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.evaluate table",
        description="The paper's Table 2: arms x tasks, mean ± std over seeds, average, rank, t-test.",
    )
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN|ARM=RUN1,RUN2",
        help="evaluated runs (run folders or their evaluation folders), grouped into arms by their run.json "
        "settings but the seed; or arms named explicitly (none: the --pretrained row alone)",
    )
    p.add_argument("--out", type=out_folder, required=True, help="folder for table.md, table.csv and table.png")
    add_table_arguments(p)
    return p


def add_table_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The options ``evaluate table`` and ``paper table2`` share."""
    p.add_argument(
        "--select",
        type=_selection,
        default="best",
        help="checkpoint per run: best (highest mean acc among the steps the authors evaluate, "
        "default), last, or step:N",
    )
    p.add_argument(
        "--reference",
        metavar="ARM",
        help="arm the others are tested against (default: the arm training with angular_spread, the paper's "
        "reference row; else the first with a dispersion loss)",
    )
    p.add_argument(
        "--test",
        choices=TESTS,
        default="student",
        help="t-test of the per-seed averages: student (equal variances, the paper's; default) or welch",
    )
    p.add_argument(
        "--num-ckpt",
        type=positive_int,
        help="--select best: the authors evaluate every floor(T/K)+1 steps and at the last step T; K (their "
        "--num_ckpt; default: their scripts' own, 5 for mid-training runs, 2 from scratch)",
    )
    p.add_argument(
        "--best-step",
        choices=BEST_STEP,
        default="auto",
        help="--select best: per-seed (each run its own best step, the authors' mid-training "
        "plot_results.py), averaged (one step per arm, best on the seed-averaged curve, their "
        "pre-training plot_results.py), or auto (default: averaged for from-scratch arms, per-seed "
        "for mid-training arms, whose runs started from pretrained weights: run.json's started_from)",
    )
    p.add_argument(
        "--exclude-initial",
        action="store_true",
        help="--select best: step 0 (the model before training) is no candidate, even where evaluated "
        "(default: a candidate where evaluated, as the authors' --eval_at_begin makes it one)",
    )
    p.add_argument(
        "--pretrained",
        default="auto",
        metavar="auto|none|RUN,...",
        help="the Pretrained row (the model before training) and each arm's difference from it: auto "
        "(default: step 0 of the first arm without a dispersion loss, when evaluated), none, or "
        "evaluated runs or folders whose step 0 is that model (evaluate hf:MODEL --out DIR writes one; "
        "paper table2 --pretrained hf:MODEL evaluates it first)",
    )


@command(REWRITTEN)
def write_table(argv: list[str]) -> None:
    """``table``: evaluated runs' scores, rewritten whole (``owners.rewritten``), so said as ``compare``'s."""
    a = table_parser().parse_args(argv)
    with owned(a.out, TABLE):  # from before torch's import: of two at once into one --out, one writes
        from dispersion_titan.evaluation.table import Selection, table  # torch: after --help

        selection = Selection(a.select, a.num_ckpt, a.exclude_initial, a.best_step)
        print(table(a.runs, a.out, selection, a.reference, a.test, a.pretrained).markdown)
    print(f"written: {os.path.join(a.out, 'table.md')}, table.csv, table.png")
    sys.exit(0)


@command("each step evaluated so far is kept in its folder; the same command goes on")
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "table":
        write_table(argv[1:])
    a = evaluate_parser().parse_args(argv)
    from dispersion_titan.evaluation.runner import RunEvaluation  # torch: after --help

    sys.exit(1 if RunEvaluation(a).evaluate() else 0)


if __name__ == "__main__":
    run_command(main)
