"""Each of the paper's figures and Table 2 from one command.

    python -m dispersion_titan.paper --list
    python -m dispersion_titan.paper ARTIFACT [--out DIR] [--models ...] [--slurm] [--dry-run] [analyze options]
    python -m dispersion_titan.paper fig3|table2 --plan [--plan-gpus N] [--plan-gpu h100|h200|a100]

Runs ``analyze`` (or ``evaluate``) per model, here in order or as Slurm jobs, reusing finished
results, then draws ``DIR/ARTIFACT.png``, ``.pdf`` and ``.json``.
"""

from __future__ import annotations

import os
import sys

from dispersion_titan import analyze
from dispersion_titan.config import cli
from dispersion_titan.config.cli import OneLineErrorParser, add_device_arguments, non_negative_int, positive_int
from dispersion_titan.evaluate import add_table_arguments, task_folder, task_limit
from dispersion_titan.evaluate import main as evaluate_main
from dispersion_titan.plan import plan_args, plan_runs
from dispersion_titan.planning.figures import GPUS
from dispersion_titan.reproduce.paper import catalog
from dispersion_titan.reproduce.slurm_scripts import script, submit
from dispersion_titan.run_folder.owners import FolderOwner, owned, refuse_unless_ours
from dispersion_titan.utils.devices import AUTOCAST
from dispersion_titan.utils.errors import command, fail, run_command

ARTIFACT_NAMES = tuple(catalog.ARTIFACTS)
PAPER = FolderOwner("paper")


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
    p.add_argument("--out", type=cli.named_out, default="outputs/paper", help="output folder (default %(default)s)")
    p.add_argument(
        "--models",
        nargs="+",
        type=cli.named("a hub id, a model folder, an hf: spec or a run"),
        metavar="MODEL",
        help="replace the paper's models: hub ids, local model folders, hf: specs or our runs "
        "(fig5: the bases, then their distilled models; table2: RUN or ARM=RUN1,RUN2)",
    )
    p.add_argument("--slurm", action="store_true", help="submit the jobs and a drawing job (launch_scripts/slurm/)")
    p.add_argument("--dry-run", action="store_true", help="print every command, run nothing")
    p.add_argument(
        "--plan",
        action="store_true",
        help="fig3, table2: plan their training runs (dispersion-titan plan): a row per config, totals; runs nothing",
    )
    p.add_argument("--plan-gpus", type=positive_int, help="--plan: GPUs per training run (default 8)")
    p.add_argument("--plan-gpu", choices=GPUS, help="--plan: the GPU (default h100)")
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
        metavar="|".join(catalog.FIG3_ROWS),
        help="fig3: last (default: the last checkpoint, the paper's one row) or first,last (plot_heatmaps.py's two)",
    )
    p.add_argument(
        "--corpus",
        action="append",
        type=cli.named("a corpus as NAME=DATASET or NAME=FILE"),
        metavar="NAME=DATASET|FILE",
        help="robustness: a corpus (a registered --dataset or a jsonl file); replaces the paper's four",
    )
    analysis = p.add_argument_group("analyze's input options, passed on (analysing artifacts; analyze's defaults)")
    analyze.add_input_arguments(analysis, defaults=False)
    analysis.add_argument(
        "--protocol",
        help="analyze's --protocol: paper (the default: the authors' wikitext-103 texts, or the rows "
        "of --texts, and transformers' n+1 hidden_states points) or default; for table2 "
        "evaluate's (default: each run's family)",
    )
    analysis.add_argument("--batch-size", type=positive_int, help="sequences (or examples) per forward pass")
    add_device_arguments(
        analysis,
        dtype_default=None,
        dtype_help="model dtype: fp32 (the analysing artifacts' default, as the authors loaded them) or bf16; for "
        "table2 evaluate's, default autocast (fp32 weights under bf16 autocast, as the authors' in-training "
        "lm-eval callback scored), fp32 or bf16",
        dtypes=("fp32", "bf16", AUTOCAST),
    )
    analysis.add_argument("--device-map", choices=("auto",), help="hf: spread a model over all visible GPUs")
    analysis.add_argument("--force", action="store_true", help="analyze's and evaluate's: recompute their results")
    analysis.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the code the models ship; without it the paper's models that need it (the "
        "original Qwen) are left out, and given --models that need it are refused",
    )
    table = p.add_argument_group("table2")
    kinds = (str, task_folder, task_limit, non_negative_int)  # evaluate's types: refused before any step runs
    for option, kind in zip(("--tasks", "--include-path", "--limit", "--num-fewshot"), kinds, strict=True):
        table.add_argument(option, type=kind, help=f"evaluate's {option}")
    add_table_arguments(table)
    return p


def run_paper(argv: list[str]) -> int:
    a = paper_parser().parse_args(argv)
    if a.list:
        print(catalog.listing())
        return 0
    from dispersion_titan.evaluation.table import Selection  # torch: after --help and --list
    from dispersion_titan.reproduce.paper import render
    from dispersion_titan.reproduce.paper import workflow as workflows

    if a.artifact is None:
        fail("ARTIFACT: name one of " + ", ".join(ARTIFACT_NAMES) + " (or --list)")
    if not a.plan and (a.plan_gpus or a.plan_gpu):  # was: ignored, and passed on to the drawing command
        fail(f"{'--plan-gpus' if a.plan_gpus else '--plan-gpu'}: only with --plan")
    selection = Selection(a.select, a.num_ckpt, a.exclude_initial, a.best_step)  # refused before anything runs
    if a.plan:
        runs = workflows.training_runs(a.artifact, a.preset or "paper")
        named = [(name, plan_args(c, overrides=o)) for name, c, o in runs]
        plan_runs(named, a.plan_gpus or 8, None, a.plan_gpu or "h100", "--plan-gpus")
        if a.artifact == "table2":
            print(catalog.pretrained_rows())
        return 0
    options = {**vars(a), "out": os.path.realpath(a.out)}  # one folder by any path: the same jobs (as the sweep)
    refuse_unless_ours(options["out"], PAPER, "--out", "use another --out")  # --dry-run too: it shows what would run
    workflow = workflows.build(a.artifact, options)
    said = f"{a.artifact}: left out {', '.join(workflow.left_out)}: they run their own modelling code; add "
    for note in ([said + "--trust-remote-code to include them"] if workflow.left_out else []) + workflow.notes:
        print(note, file=sys.stderr)
    if a.slurm and not a.draw_only:
        workflows.refuse_other_settings(workflow, analyze.analyze_parser(), queued=not a.dry_run)
        jobs = workflows.slurm_jobs(workflow, workflows.draw_argv(argv, workflow, options), a.sbatch_args)
        logs = os.path.join(workflow.out, "logs")
        if a.dry_run:
            header = [f"# {a.artifact}: {len(jobs) - 1} jobs + the drawing job", *(f"# {n}" for n in workflow.notes)]
            print(script(header, jobs, logs))
            return 0
        with owned(workflow.out, PAPER):  # its logs/ are the first files the folder holds
            submit(jobs, logs, recorded=lambda: workflows.record_gpus(workflow))
        print(f"submitted; the drawing job writes {workflow.out}/{a.artifact}.* (logs: {workflow.out}/logs)")
        return 0
    if a.dry_run:
        draw = workflows.Step("paper", workflows.draw_argv(argv, workflow, options), "draw")
        print("\n".join(step.shell() for step in [*([] if a.draw_only else workflow.steps), draw]))
        return 0
    if not a.draw_only:
        import torch

        workflows.check_hub(workflow)
        workflows.check_devices(workflow, options, torch.cuda.is_available())
    with owned(workflow.out, PAPER):  # each analyze or evaluate it runs holds its own --out as well
        if not a.draw_only:
            workflows.run_locally(workflow, {"analyze": analyze.main, "evaluate": evaluate_main})
        written = render.render(workflow, selection, a.reference, a.test)
    print("written: " + ", ".join(written))
    return 0


@command(
    "each analysis and evaluation finished so far is kept in --out; the same command goes on from there (with "
    "--slurm: the jobs submitted so far stay queued, their ids above; submit again once they end, or scancel them)"
)
def main(argv: list[str] | None = None) -> None:
    sys.exit(run_paper(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    run_command(main)
