"""Plan a run before a GPU-hour is spent: its layout on N GPUs, parameters per rank, peak memory
per GPU by category against the GPU's, step time, tokens/s, GPU-hours and checkpoint disk.

An impossible layout ends in one line naming the field, exit status 2 (docs/cluster.md).
"""

from __future__ import annotations

import os
import sys

from dispersion_titan.config.cli import OneLineErrorParser, launch_args, positive_int, read_toml
from dispersion_titan.planning.figures import GPUS, counted  # no torch: --help answers at once
from dispersion_titan.utils.errors import ArgumentError, ConfigError, command, run_command


def plan_parser() -> OneLineErrorParser:
    p = OneLineErrorParser(prog="python -m dispersion_titan.plan", description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="a training TOML, e.g. train_configs/gpt2_small_mlp3072.toml")
    p.add_argument("--gpus", type=positive_int, default=1, help="GPUs of the run, all nodes together (default 1)")
    p.add_argument("--nodes", type=positive_int, help="nodes they are on (default: 8 GPUs a node)")
    p.add_argument("--tp", type=positive_int, help="tensor-parallel degree (default: the config's)")
    p.add_argument("--gpu", choices=GPUS, default="h100", help="the GPU (default h100)")
    p.add_argument(
        "--dry-run-step",
        action="store_true",
        help="also build the real trainer as rank 0 of the GPUs (fake collectives, CPU, shrunk) and take "
        "one step: checks the mesh, the parallelize plan and the dispersion accounting",
    )
    return p


def plan_args(config: str, tp: int | None = None, overrides: tuple[str, ...] = ()) -> list[str]:
    """A launch's command line for ``config`` with the ``overrides`` and ``--tp``."""
    tp_args = () if tp is None else ("--parallelism.tensor_parallel_degree", str(tp))
    return launch_args(config, *overrides, *tp_args)


def plan_runs(
    runs: list[tuple[str, list[str]]], gpus: int, nodes: int | None, gpu: str, gpus_option: str | None = None
) -> None:
    """``sweep --plan``, ``paper --plan``: each (name, launch arguments) planned on ``gpus`` × ``gpu``, one
    table with the totals, then a run that does not fit refused. ``gpus_option``: the option that chose
    ``gpus``, named when a run cannot be laid out on them."""
    from dispersion_titan.planning import resource_plan as work  # torch and TorchTitan: once the arguments parse

    plans = []
    for name, args in runs:
        try:
            plans.append(work.planned(name, args, gpus, nodes, gpu))
        except ConfigError as e:
            if gpus_option is None:
                raise
            work.validated_args(args, 1)  # a run no layout fits says so itself
            raise ArgumentError(
                f"{gpus_option}: {name} cannot be laid out on {counted(gpus, 'GPU')} ({str(e).split('; ')[0]}); "
                f"give a {gpus_option} that fits it"
            ) from None
    print(work.runs_table(plans), flush=True)
    for plan in plans:
        work.refuse_if_too_big(plan)


def _config_first(config: str, argv: list[str]) -> None:
    """``plan --training.steps 100 CONFIG`` reads 100 as CONFIG: said so, with the order that works; else
    CONFIG's own errors name CONFIG, the argument typed."""
    before = argv[argv.index(config) - 1] if argv.index(config) else ""
    if not os.path.isfile(config) and before.startswith("--") and "." in before:
        raise ArgumentError(
            f"CONFIG: {config!r} was read as the config file, as {before} comes before it; give the config "
            f"first: plan CONFIG {before} {config} ..."
        )
    read_toml(config, "CONFIG")


@command("nothing was written")
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args, overrides = plan_parser().parse_known_args(argv)
    _config_first(args.config, argv)
    launch = plan_args(args.config, args.tp, tuple(overrides))
    from dispersion_titan.planning import dry_run, resource_plan  # --help and typos answered without them

    plan = resource_plan.planned(args.config, launch, args.gpus, args.nodes, args.gpu)
    print(resource_plan.plan_table(plan), flush=True)
    resource_plan.refuse_if_too_big(plan)
    if args.dry_run_step:
        print("\n".join(["", *dry_run.dry_run_step(launch, plan.layout)]))


if __name__ == "__main__":
    run_command(main)
