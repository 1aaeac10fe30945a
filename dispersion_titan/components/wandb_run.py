"""A training run's W&B run, named in its run folder (``WANDB_RUN_FILE``), so that a relaunch resuming it,
``analyze`` and ``evaluate --wandb`` log to the same run."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any

from ..utils.errors import ArgumentError
from ..utils.records import atomic_write

WANDB_RUN_FILE = "wandb_run.json"  # in the dump folder: the W&B run of the latest launch
USER_NAMED = ("WANDB_RUN_ID", "WANDB_RESUME_FROM", "WANDB_FORK_FROM")  # the W&B run the user chose for TorchTitan's


NOT_INSTALLED = "the wandb package is not installed; pip install 'dispersion_titan[wandb]'"


def unusable() -> str | None:
    """Why W&B cannot log here, checked before any work: no wandb (``NOT_INSTALLED``), or a ``WANDB_MODE`` it refuses,
    whose own refusal came as TorchTitan's logged error, training going on without W&B (exit 0), or as
    ``analyze``/``evaluate --wandb``'s traceback once their work was done."""
    if importlib.util.find_spec("wandb") is None:
        return NOT_INSTALLED
    mode = os.environ.get("WANDB_MODE")
    if mode is None:
        return None
    from wandb.sdk.wandb_settings import Settings  # wandb's own modes: its Settings validates them

    modes = typing.get_args(Settings.model_fields["mode"].annotation)
    if mode in modes:
        return None
    return f"WANDB_MODE: {mode!r} is not one of W&B's modes ({', '.join(modes)}); set one of them, or unset it"


def continue_recorded(dump_folder: str) -> None:
    """Before TorchTitan's ``wandb.init``, for a launch resuming this run folder's checkpoints: the W&B run its
    ``WANDB_RUN_FILE`` names, resumed (``WANDB_RUN_ID``, ``WANDB_RESUME=allow``), one W&B run however often Slurm
    requeues it. Not where the user named one (``USER_NAMED``), nor in a copy or a moved folder, whose recorded
    ``run_folder`` is another path: the copy logs to a W&B run of its own, not into the original's."""
    if any(os.environ.get(name) for name in USER_NAMED):
        return
    try:
        with open(os.path.join(dump_folder, WANDB_RUN_FILE)) as f:
            named = json.load(f)
    except (OSError, ValueError):  # none, or unreadable: a new W&B run, as before
        return
    ours = isinstance(named, dict) and named.get("run_folder") == os.path.realpath(dump_folder)
    if ours and isinstance(named.get("id"), str):  # an id of another type or none: unreadable (were tracebacks)
        os.environ["WANDB_RUN_ID"] = named["id"]
        os.environ.setdefault("WANDB_RESUME", "allow")


def record(dump_folder: str) -> None:
    """Name the W&B run TorchTitan's logger started in this process (none: nothing to do)."""
    wandb = sys.modules.get("wandb")  # imported by TorchTitan's WandBLogger only
    run = None if wandb is None else wandb.run
    if run is None or run.disabled:  # WANDB_MODE=disabled: a no-op run, which logs nowhere
        return
    # W&B's folder within the run folder relative to it: root_dir is relative to the launch's working
    # directory (a relative dump_folder, as the shipped configs'), and the run folder may be moved
    root, dump = os.path.abspath(run.settings.root_dir), os.path.abspath(dump_folder)
    where = os.path.relpath(root, dump) if os.path.commonpath([root, dump]) == dump else root
    named = {"id": run.id, "project": run.project, "entity": run.entity, "dir": where}
    named["run_folder"] = os.path.realpath(dump_folder)  # the folder whose relaunch continues it, not a copy's
    atomic_write(os.path.join(dump_folder, WANDB_RUN_FILE), lambda f: json.dump(named, f))


def next_step() -> int:
    """The first step the W&B run of this process keeps: a resumed run's next, past the steps it logged (W&B drops
    earlier ones, a warning each); 0 for a new one, or offline, where W&B knows no earlier launch's steps."""
    wandb = sys.modules.get("wandb")
    run = None if wandb is None else wandb.run
    return 0 if run is None or run.disabled else run.starting_step


def recorded(dump_folder: str) -> dict[str, Any]:
    """The W&B run named in ``dump_folder``; one-line errors for ``--wandb`` when there is none."""
    path = os.path.join(dump_folder, WANDB_RUN_FILE)
    if not os.path.isfile(path):
        raise ArgumentError(
            f"--wandb: {dump_folder} names no W&B run ({WANDB_RUN_FILE}); train it with [metrics] enable_wandb = true "
            "(and WANDB_MODE not disabled)"
        )
    if why := unusable():
        raise ArgumentError(f"--wandb: {why}")
    try:
        with open(path) as f:
            named = json.load(f)
        fields = ("id", "project", "dir") if isinstance(named, dict) else ()
        if not fields or not all(isinstance(v, str) for v in [*map(named.get, fields), named.get("entity") or ""]):
            raise ValueError("no W&B run's id, project, entity and dir")
    except (OSError, ValueError) as e:  # ValueError: JSON's, UTF-8's, or ours (were tracebacks)
        raise ArgumentError(
            f"--wandb: {path}: unreadable ({e}); restore it: it names the W&B run the run logged to"
        ) from None
    return named


def log_results(dump_folder: str, job_type: str, prefix: str, per_step: dict[int, dict[str, Any]], folder: str) -> None:
    """Into the W&B run of ``dump_folder``, resumed for ``job_type`` (``analyze``, ``evaluate``): ``per_step``
    values as ``PREFIX/NAME`` against ``checkpoint_step`` (the resumed run's own step is past training's),
    then ``folder``'s tables (``*.csv``) and figures (``*.png``)."""
    import wandb

    named = recorded(dump_folder)
    run = wandb.init(
        id=named["id"],
        project=named["project"],
        entity=named["entity"] or None,
        dir=os.path.join(dump_folder, named["dir"]),
        resume="allow",
        job_type=job_type,
    )
    try:
        run.define_metric("checkpoint_step")
        for name in sorted({name for values in per_step.values() for name in values}):
            run.define_metric(f"{prefix}/{name}", step_metric="checkpoint_step")
        for step, values in sorted(per_step.items()):
            run.log({"checkpoint_step": step, **{f"{prefix}/{name}": value for name, value in values.items()}})
        logged: dict[str, Any] = {}
        for path in sorted(Path(folder).glob("*.csv")):
            with open(path, newline="") as f:
                rows = list(csv.reader(f))
            logged[f"{prefix}/{path.stem}"] = wandb.Table(columns=rows[0], data=rows[1:])
        for path in sorted(Path(folder).glob("*.png")):
            logged[f"{prefix}/{path.stem}"] = wandb.Image(str(path))
        run.log(logged)
    finally:
        run.finish()
