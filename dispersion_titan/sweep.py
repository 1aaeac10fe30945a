"""Submit the controlled experiment to Slurm: MLP width x variant x seed.

Each cell trains (``train.sbatch``) into ``OUT/<cell>``, then is analysed and evaluated after
its training (``--dependency=afterok``); one compare job follows every training and analysis,
one ``evaluate table`` job every evaluation. Flags win over the SPEC file (keys as in
launch/sweep_example.toml); a submission records the job ids in ``OUT/sweep.json``, and the same
command again submits the jobs Slurm no longer holds whose results are missing (``reproduce.sweep.resubmission``).
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Callable, NoReturn

from dispersion_titan.analyze import analyze_parser
from dispersion_titan.config.cli import OneLineErrorParser, read_toml
from dispersion_titan.config.schema import BASELINE_METHODS
from dispersion_titan.evaluate import evaluate_parser
from dispersion_titan.plan import plan_runs
from dispersion_titan.planning.figures import GPUS, counted
from dispersion_titan.reproduce.slurm_scripts import SlurmJob, require_sbatch, script, submit
from dispersion_titan.run_folder.owners import FolderOwner, owned
from dispersion_titan.utils.errors import ArgumentError, command, run_command


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    overrides: list[str] = []
    if "--" in argv:
        argv, overrides = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.sweep",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="After --, training overrides for every cell, e.g. -- --training.steps 1000",
    )
    p.add_argument("file", nargs="?", metavar="SWEEP.toml", help="TOML file with the keys below (flags win)")
    p.add_argument("--config", help="training TOML shared by every cell")
    p.add_argument(
        "--out",
        help="sweep folder (default outputs/sweep-<config>-<time>): new, or this sweep's to submit its stopped jobs",
    )
    p.add_argument("--widths", help="MLP hidden widths, e.g. 256,512")
    p.add_argument(
        "--variants",
        help=f"baseline, {', '.join(BASELINE_METHODS)} and/or NAME:COEFF, "
        "e.g. baseline,angular_spread:0.1,noisy_embedding",
    )
    p.add_argument("--seeds", help="seeds, e.g. 0,1,2")
    p.add_argument("--partition")
    p.add_argument("--account")
    p.add_argument("--train-time", help="time limit of each training job (sbatch --time)")
    p.add_argument("--analyze-time", help="time limit of each analysis job and of the compare job")
    p.add_argument("--evaluate-time", help="time limit of each evaluation job and of the table job")
    p.add_argument("--nodes", help="nodes per training job")
    p.add_argument(
        "--gpus-per-node",
        help="GPUs per node of each training job (default: SBATCH_GPUS_PER_NODE, else train.sbatch's 8; 0: none)",
    )
    p.add_argument("--cpus-per-task", help="CPUs per node of each training job (default: train.sbatch's 64)")
    p.add_argument(
        "--analyze-gpus", help="GPUs of each analysis and compare job (default: analyze.sbatch's 1; 0: none)"
    )
    for kind, jobs, example in (
        ("train", "training jobs", "--gpus-per-node=8"),
        ("analyze", "analysis and compare jobs", "--gpus=1"),
        ("evaluate", "evaluation and table jobs", "--mem=64G"),
    ):
        p.add_argument(
            f"--{kind}-sbatch-arg",
            action="append",
            dest=f"{kind}_sbatch_args",
            metavar="ARG",
            help=f"extra sbatch argument for {jobs}, e.g. --{kind}-sbatch-arg={example}",
        )
    p.add_argument("--analyze-args", help='analysis options, e.g. --analyze-args="--num-sequences 100"')
    p.add_argument("--evaluate-args", help='evaluation options, e.g. --evaluate-args="--tasks piqa --limit 100"')
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sbatch commands submitting would run (into a submitted sweep's OUT: its stopped jobs); "
        "submit nothing",
    )
    p.add_argument(
        "--plan",
        nargs="?",
        const="h100",
        choices=GPUS,
        metavar="GPU",
        help="print every training job's resource plan on GPU (default h100) and the totals; submit nothing",
    )
    return p.parse_args(argv), overrides


def _refuse(key: str, message: str) -> NoReturn:
    raise ArgumentError(f"{key}: {message}")


def _finished(finished: set[str], jobs: list[SlurmJob], out: Path, done: str) -> bool:
    """Whether every job is finished (``resubmission``), said in one line."""
    if len(finished) < len(jobs):
        return False
    print(f"sweep: finished (every job's results are in {out}); nothing {done}")
    return True


def _kept(kept: dict[str, str]) -> str:
    return f" ({len(kept)} kept: still queued or running, or finished)" if kept else ""


@command("nothing was submitted")  # a dry run, a plan, the checks; submitting says what it queued (_submit)
def main(argv: list[str] | None = None) -> None:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    # Imported after parsing: --help and typos answer without torch and TorchTitan (seconds).
    from dispersion_titan.reproduce import sweep as slurm_sweep

    raw = read_toml(args.file, "SWEEP.toml") if args.file is not None else {}
    raw.update({k: v for k, v in vars(args).items() if k not in ("file", "dry_run", "plan") and v is not None})
    if overrides:
        raw["train_overrides"] = overrides
    sweep = slurm_sweep.read_sweep(raw)
    configs = slurm_sweep.check_training_configs(sweep)
    options = {}  # each job's options, as it will parse them hours from now (--steps, --out: what it writes)
    for key, parser in (("analyze_args", analyze_parser()), ("evaluate_args", evaluate_parser())):
        parser.error = functools.partial(_refuse, key)
        options[key] = parser.parse_args([str(sweep.out), *getattr(sweep, key)])
    slurm_sweep.refuse_shared_folders(sweep, options)
    slurm_sweep.refuse_elsewhere(sweep, options)  # before: a relative path's refusal names the folder it is in
    slurm_sweep.refuse_unreadable_inputs(options)
    if args.plan:  # the cells' training jobs planned on their GPUs
        nodes, gpus_per_node = slurm_sweep.train_layout(sweep)
        if gpus_per_node == 0:
            raise ArgumentError("--plan: plans GPU jobs, and gpus_per_node is 0")
        runs = [(cell.name, slurm_sweep.cell_args(sweep, cell)) for cell in sweep.cells()]
        plan_runs(runs, slurm_sweep.world_size(sweep), nodes, args.plan)
        return
    largest = max(GPUS.values(), key=lambda gpu: gpu.memory_gb)  # the cluster's GPU is not known here
    slurm_sweep.refuse_beyond_memory(sweep, configs, largest.name, largest.memory_gb)
    jobs = slurm_sweep.slurm_jobs(sweep)
    analyze, evaluate = options["analyze_args"], options["evaluate_args"]
    resubmission = functools.partial(slurm_sweep.resubmission, sweep, jobs, configs, analyze, evaluate)
    if args.dry_run:  # what submitting now would submit
        todo, kept, finished = resubmission()
        if not _finished(finished, jobs, sweep.out, "to submit"):
            grid = f"# sweep: {counted(len(sweep.cells()), 'cell')} x (train, analyze, evaluate) + compare + table"
            again = [f"# submitted before: {len(todo)} of them to submit{_kept(kept)}"] if kept else []
            print(script([f"{grid} = {len(jobs)} jobs; out {sweep.out}", *again], todo, sweep.out / "logs", kept))
        return
    _submit(
        sweep.out, jobs, resubmission, slurm_sweep.refuse_used, functools.partial(slurm_sweep.write_manifest, sweep)
    )


@command(
    "the jobs submitted so far stay queued (their ids are above): the same command again submits the rest, "
    "or scancel them to start over"
)
def _submit(out: Path, jobs: list[SlurmJob], resubmission: Callable, refuse_used: Callable, manifest: Callable) -> None:
    """The sweep's jobs submitted into ``out`` (``resubmission``: those to submit), each recorded (``manifest``)."""
    require_sbatch()
    with owned(str(out), FolderOwner("sweep")):  # one submission: a second started alongside is refused
        refuse_used(out)
        todo, kept, finished = resubmission()
        if _finished(finished, jobs, out, "submitted"):
            return
        ids = dict(kept)
        recorded = [next((j for j in todo if j.key == job.key), job) for job in jobs]  # as submitted, last
        record = functools.partial(manifest, recorded, ids)
        then = "; fix the cause and submit the sweep again for the rest"
        try:  # each job recorded once submitted, also before a kill -9: the same command again submits the rest
            submit(todo, out / "logs", ids, then=then, recorded=record)
        finally:  # and those submitted before a refusal (the others null: they may take the settings that fix it)
            written = record() if ids else None
        print(f"sweep: {counted(len(todo), 'job')} submitted{_kept(kept)}; manifest {written}")


if __name__ == "__main__":
    run_command(main)
