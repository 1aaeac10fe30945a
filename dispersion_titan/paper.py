"""Each of the paper's figures and Table 2 from one command.

    python -m dispersion_titan.paper --list
    python -m dispersion_titan.paper ARTIFACT [--out DIR] [--models ...] [--slurm] [--dry-run] [analyze options]
    python -m dispersion_titan.paper fig3|table2 --plan [--plan-gpus N] [--plan-gpu h100|h200|a100]

Runs ``analyze`` (or ``evaluate``) per model, here in order or as Slurm jobs, reusing finished
results, then draws ``DIR/ARTIFACT.png``, ``.pdf`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from dispersion_titan.analyze import add_input_arguments
from dispersion_titan.analyze import main as analyze_main
from dispersion_titan.config.cli import OneLineErrorParser, add_device_arguments, positive_int
from dispersion_titan.evaluate import add_table_arguments
from dispersion_titan.evaluate import main as evaluate_main
from dispersion_titan.plan import GPU_CHOICES, plan_args, plan_runs
from dispersion_titan.reproduce.paper import catalog
from dispersion_titan.reproduce.slurm_scripts import script, submit
from dispersion_titan.run_folder.outputs import ensure_writable, write_json
from dispersion_titan.run_folder.owners import FolderOwner, owned
from dispersion_titan.utils.errors import command, fail, run_command

if TYPE_CHECKING:  # torch: imported after --help and --list
    from dispersion_titan.reproduce.paper.workflow import PaperWorkflow

ARTIFACT_NAMES = tuple(catalog.ARTIFACTS)
DEFAULT_OUT = "outputs/paper"
PAPER = FolderOwner("paper")
TITLES = {
    "fig2": "Condensation by model size (Fig. 2)",
    "fig3": "Condensation by MLP width (Fig. 3)",
    "fig4": "Condensation over pre-training, from initialization (Fig. 4)",
    "fig5": "Distilled models against their bases (Fig. 5)",
    "counteract": "Mid-training with and without the dispersion loss, checkpoint by checkpoint",
    "robustness": "Condensation by model size on other texts (dataset robustness)",
}
AGAINST = {"n_params": "size", "mlp_width": "MLP width", "step": "step", "training_order": "training"}  # in titles


def paper_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.paper",
        description="One of the paper's figures or Table 2: runs what it needs, then draws it.",
    )
    p.add_argument(
        "artifact",
        nargs="?",
        choices=ARTIFACT_NAMES,
        metavar="ARTIFACT",
        help=f"one of {', '.join(ARTIFACT_NAMES)} (--list describes them)",
    )
    p.add_argument("--list", action="store_true", help="each artifact: what it runs, the paper's models, the compute")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument(
        "--models",
        nargs="+",
        metavar="MODEL",
        help="replace the paper's models: hub ids, local model folders, hf: specs or our runs "
        "(fig5: the bases, then their distilled models; table2: RUN or ARM=RUN1,RUN2)",
    )
    p.add_argument(
        "--slurm",
        action="store_true",
        help="submit the jobs (the package's launch_scripts/slurm/*.sbatch) and a drawing job",
    )
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    p.add_argument(
        "--plan",
        action="store_true",
        help="fig3, table2: the resource plan of the training runs they need (dispersion-titan plan), "
        "one row per config with the totals; runs nothing",
    )
    p.add_argument("--plan-gpus", type=positive_int, default=8, help="--plan: GPUs per training run (default 8)")
    p.add_argument("--plan-gpu", choices=GPU_CHOICES, default="h100", help="--plan: the GPU (default h100)")
    p.add_argument("--draw-only", action="store_true", help="draw from finished results, run nothing else")
    p.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        dest="sbatch_args",
        metavar="ARG",
        help="extra sbatch argument for every job, e.g. --sbatch-arg=--partition=gpu",
    )
    p.add_argument("--revisions", metavar="REV1,REV2", help="fig4: the revisions (default: listed from the hub)")
    p.add_argument(
        "--preset",
        choices=tuple(catalog.FIG3_PRESETS),
        help="fig3: the runs to train and draw: paper (default: train_configs/paper/fig3_gpt2_small*.toml, "
        "the authors' pretrain_toy_gpt2.py) or ours (train_configs/gpt2_small_mlp*.toml)",
    )
    p.add_argument(
        "--pick",
        choices=catalog.FIG3_PICKS,
        help="fig3: the run drawn per width: ce (default: its cross-entropy-only run, the paper's claim) or "
        "authors (plot_heatmaps.py's pick: a dispersion run first)",
    )
    p.add_argument(
        "--rows",
        choices=tuple(catalog.FIG3_ROWS),
        help="fig3: last (default: the last checkpoint, the paper's one row) or first,last (plot_heatmaps.py's two)",
    )
    p.add_argument(
        "--corpus",
        action="append",
        metavar="NAME=DATASET|FILE",
        help="robustness: a corpus (a registered --dataset or a jsonl file); replaces the paper's four",
    )
    analysis = p.add_argument_group("analyze's input options, passed on (analysing artifacts; analyze's defaults)")
    add_input_arguments(analysis, defaults=False)
    analysis.add_argument(
        "--protocol",
        help="analyze's --protocol: paper (the default: the authors' wikitext-103 texts, or the rows "
        "of --texts, and transformers' n+1 hidden_states points) or default; for table2 "
        "evaluate's (default: each run's family)",
    )
    analysis.add_argument("--batch-size", type=positive_int, help="sequences (or examples) per forward pass")
    add_device_arguments(analysis, dtype_default=None, dtype_help="model dtype (default fp32, as the authors ran)")
    analysis.add_argument("--device-map", choices=("auto",), help="hf: spread a model over all visible GPUs")
    analysis.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code the models ship; without it the paper's models that need it (the "
        "original Qwen) are left out, and given --models that need it are refused",
    )
    table = p.add_argument_group("table2")
    for option in ("--tasks", "--include-path", "--limit", "--num-fewshot"):
        table.add_argument(option, help=f"evaluate's {option}")
    add_table_arguments(table)
    return p


def render(workflow: PaperWorkflow, a: argparse.Namespace) -> list[str]:
    """Draw the artifact from the results its workflow made (nothing is written unless every
    result is there); return the files written."""
    from dispersion_titan.evaluation.table import Selection  # torch and matplotlib: after --help and --list
    from dispersion_titan.reproduce.paper import collect, draw, table2

    ensure_writable(workflow.out, "--out")
    stem = os.path.join(workflow.out, workflow.artifact)
    if workflow.artifact == "table2":
        selection = Selection(a.select, a.num_ckpt, a.exclude_initial, a.best_step)
        print(table2.write_table2(workflow.runs, workflow.out, selection, a.reference, a.test, workflow.pretrained))
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


def run_paper(argv: list[str]) -> int:
    a = paper_parser().parse_args(argv)
    if a.list:
        print(catalog.listing())
        return 0
    from tqdm import tqdm

    from dispersion_titan.reproduce.paper import workflow as workflows  # torch: after --help and --list

    if a.artifact is None:
        fail("ARTIFACT: name one of " + ", ".join(ARTIFACT_NAMES) + " (or --list)")
    if a.plan:
        runs = workflows.training_runs(a.artifact, a.preset or "paper")
        plan_runs(
            [(name, plan_args(c, overrides=o)) for name, c, o in runs], a.plan_gpus, None, a.plan_gpu, "--plan-gpus"
        )
        if a.artifact == "table2":
            pretrained = [row for row in catalog.TABLE2_ROWS if row.model]
            trained = {row.block for row in catalog.TABLE2_ROWS if row.config}
            print(
                f"\nand {len(pretrained)} Pretrained rows, no training (0 GPU-hours): step 0 of the block's "
                "baseline runs, or (GPT2-large, -xl) the hub model evaluated as published:"
            )
            for row in pretrained:
                option = "auto" if row.block in trained else f"hf:{row.model}"
                print(f"| {row.block}: {row.label} | {row.model} | --pretrained {option} |")
        return 0
    options = {**vars(a), "out": os.path.abspath(a.out)}
    workflow = workflows.build(a.artifact, options)
    if workflow.left_out:
        print(
            f"{a.artifact}: left out {', '.join(workflow.left_out)}: they run their own modelling code; add "
            "--trust-remote-code to include them",
            file=sys.stderr,
        )
    if a.slurm and not a.draw_only:
        workflow.notes += workflows.training_layouts(workflow, a.sbatch_args)
    for note in workflow.notes:
        print(note, file=sys.stderr)
    if a.slurm and not a.draw_only:
        jobs = workflows.slurm_jobs(workflow, workflows.draw_argv(argv, workflow, options), a.sbatch_args)
        logs = os.path.join(workflow.out, "logs")
        if a.dry_run:
            header = [f"# {a.artifact}: {len(jobs) - 1} jobs + the drawing job", *(f"# {n}" for n in workflow.notes)]
            print(script(header, jobs, logs))
            return 0
        with owned(workflow.out, PAPER):  # its logs/ are the first files the folder holds
            submit(jobs, logs)
        print(f"submitted; the drawing job writes {workflow.out}/{a.artifact}.* (logs: {workflow.out}/logs)")
        return 0
    if a.dry_run:
        draw = workflows.Step("paper", workflows.draw_argv(argv, workflow, options), "draw")
        print("\n".join(step.shell() for step in [*workflow.steps, draw]))
        return 0
    if not a.draw_only:
        import torch

        workflows.check_hub(workflow)
        workflows.check_devices(workflow, options, torch.cuda.is_available())
    with owned(workflow.out, PAPER):  # each analyze or evaluate it runs holds its own --out as well
        steps = [] if a.draw_only else workflow.steps
        with tqdm(steps, desc=a.artifact, unit="model", file=sys.stderr, disable=a.draw_only) as bar:
            for step in bar:  # in order; one that fails ends the artifact with its status
                bar.set_postfix_str(step.label)
                try:
                    {"analyze": analyze_main, "evaluate": evaluate_main}[step.command](step.argv)
                except SystemExit as done:
                    if done.code not in (0, None):
                        sys.exit(done.code)  # the command said why, in one line
        written = render(workflow, a)
    print("written: " + ", ".join(written))
    return 0


@command("each analysis and evaluation finished so far is kept in --out; the same command goes on from there")
def main(argv: list[str] | None = None) -> None:
    sys.exit(run_paper(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run_command(main)
