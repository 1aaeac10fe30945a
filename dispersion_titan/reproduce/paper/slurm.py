"""``--slurm``: the workflow's steps as jobs of the package's sbatch scripts, and a last job
(``paper.sbatch``) that draws the artifact once all of them succeeded."""

from __future__ import annotations

import argparse
import os

from ...config.cli import load_toml, with_config_module
from ...job_config import released
from ...job_config.parse import setup_torchtitan, validated_args
from ..slurm_scripts import SlurmJob, sbatch, sbatch_script
from ..sweep import SBATCH_GPUS_PER_NODE
from . import catalog
from .workflow import PaperWorkflow


def jobs(workflow: PaperWorkflow, draw_argv: list[str], sbatch_args: list[str]) -> list[SlurmJob]:
    """The steps' jobs, then the drawing job, which waits for them all."""
    logs = os.path.join(workflow.out, "logs")
    lines = []
    for i, step in enumerate(workflow.steps, start=1):
        # a model too large for one GPU in its --dtype gets the GPUs its weights need and --device-map auto
        # (a later --sbatch-arg=--gpus=N wins)
        dtype = step.argv[step.argv.index("--dtype") + 1] if "--dtype" in step.argv else "fp32"
        gpus = 1 if step.size_b is None else catalog.gpus_needed(step.size_b, dtype)
        spread = [] if gpus == 1 else [f"--gpus={gpus}"]
        argv = step.argv if gpus == 1 or "--device-map" in step.argv else [*step.argv, "--device-map", "auto"]
        name = f"paper-{workflow.artifact}-{i}"
        command = [*sbatch(name, logs), *spread, *sbatch_args, str(sbatch_script(step.command)), *argv]
        lines.append(SlurmJob(f"job_{i}", name, command, [f"job_{j + 1}" for j in step.after]))
    name = f"paper-{workflow.artifact}-draw"
    draw = [*sbatch(name, logs), "--gpus=0", *sbatch_args, str(sbatch_script("paper")), *draw_argv]
    return [*lines, SlurmJob("", name, draw, [job.key for job in lines])]


def _sbatch_count(sbatch_args: list[str], option: str, default: int) -> int:
    """The last ``--option=N`` among ``--sbatch-arg`` values (sbatch's own rule: the last wins)."""
    counts = [arg.partition("=")[2] for arg in sbatch_args if arg.startswith(f"{option}=")]
    return int(counts[-1]) if counts and counts[-1].isdigit() else default


def training_layouts(workflow: PaperWorkflow, sbatch_args: list[str]) -> list[str]:
    """A paper config's ``[released]`` layout on the GPUs ``train.sbatch`` gets, per training job."""
    gpus = _sbatch_count(sbatch_args, "--gpus-per-node", SBATCH_GPUS_PER_NODE) * _sbatch_count(
        sbatch_args, "--nodes", 1
    )
    notes = []
    for step in (step for step in workflow.steps if step.command == "train"):
        setup_torchtitan()
        args = ["--job.config_file", *step.argv]
        config = validated_args(with_config_module(args, load_toml(args)), gpus)
        if released.is_on(config):
            notes.append(f"{workflow.artifact}: {step.label}: {released.summary(config)}")
    return notes


def draw_argv(argv: list[str], workflow: PaperWorkflow, options: dict) -> list[str]:
    """The drawing job's command line: this one without --slurm/--dry-run/--sbatch-arg, its --out
    absolute, with the revisions fig4 listed from the hub."""
    dropped = argparse.ArgumentParser(add_help=False)
    for flag in ("--slurm", "--dry-run"):
        dropped.add_argument(flag, action="store_true")
    for option in ("--sbatch-arg", "--out"):
        dropped.add_argument(option, action="append")
    kept = dropped.parse_known_args(argv)[1]  # the rest, in order
    if workflow.artifact == "fig4" and not options["revisions"]:
        kept += ["--revisions", workflow.models[0].target.rpartition("@")[2]]
    return [*kept, "--out", options["out"], "--draw-only"]
