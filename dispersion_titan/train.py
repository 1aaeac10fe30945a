"""Training entry point: ``torchrun … -m dispersion_titan.train --job.config_file X.toml``.

Parses and checks the whole configuration once, so bad input fails with one line naming
the field before any process group starts; then hands that config, with its derived
values filled in, to ``torchtitan.train.main`` (``titan_compat.train_main``).

``--check-only`` stops after the checks, in one process, for a job of ``WORLD_SIZE``
processes (``launch/train.sh`` runs it before torchrun): exit 0 to go on, 2 for bad
input, ``NOTHING_TO_DO`` when the run already reached ``training.steps``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import sys

from dispersion_titan.config.cli import (HELP_ALL_FLAG, HELP_FLAGS, config_file, load_toml, train_usage,
                                         with_config_module)
from dispersion_titan.config.toml_types import check_own_sections, check_toml_types
from dispersion_titan.utils.errors import ArgumentError, ConfigError, DispersionTitanError, RunFinished, fail, fail_with

CHECK_ONLY = "--check-only"
NOTHING_TO_DO = 10


def _first_message(boxed: str) -> str:
    """The first section of tyro's boxed error (the one that names the flag), on one line."""
    sections: list[list[str]] = [[]]
    for raw in boxed.splitlines():
        line = raw.strip().strip("│|╭╰╮╯").strip()
        if line and set(line) <= set("─-"):
            sections.append([])
        elif line:
            sections[-1].append(line)
    body = sections[1] if len(sections) > 1 and sections[1] else sections[0]
    return " ".join(body) or "invalid command-line arguments"


def prepare() -> None:
    """Check the TorchTitan version, adapt it to CPU-only machines, register our models."""
    from dispersion_titan.components import titan_compat
    from dispersion_titan.models import register_all

    titan_compat.apply()
    register_all()


def parse_job_config(args: list[str]):
    """``args`` parsed by TorchTitan's ``ConfigManager`` with our sections, once per launch:
    the TOML's types checked first, tyro's boxed errors turned into one line."""
    from torchtitan.config import ConfigManager

    from dispersion_titan import config as custom_config
    from dispersion_titan.components import titan_compat

    toml = load_toml(args)
    check_toml_types(titan_compat.merged_job_config_class(custom_config.JobConfig), toml, config_file(args))
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            return ConfigManager().parse_args(args)
    except SystemExit as e:  # tyro reports bad flags in a box of many lines
        raise ArgumentError(_first_message(captured.getvalue())) from e


def check(job_config, world_size: int | None = None):
    """Check every value of ``job_config`` we depend on for a job of ``world_size`` processes
    (default: ``WORLD_SIZE``, else 1), filling in the derived ones the trainer reads
    (``config_checks.check_job_config``); returns ``job_config``."""
    from torchtitan.protocols.train_spec import get_train_spec

    from dispersion_titan.models import FAMILIES, register_all
    from dispersion_titan.trainer.config_checks import check_job_config

    if job_config.model.name not in FAMILIES:
        raise ConfigError(f"model.name: {job_config.model.name!r} is not one of {FAMILIES}")
    register_all()
    flavors = get_train_spec(job_config.model.name).model_args
    if job_config.model.flavor not in flavors:
        raise ConfigError(f"model.flavor: {job_config.model.flavor!r} is not one of {sorted(flavors)} "
                          f"({job_config.model.name})")
    model_args = flavors[job_config.model.flavor]
    model_args.update_from_config(job_config)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    check_job_config(job_config, model_args, world_size)
    return job_config


def validated_args(args: list[str], world_size: int | None = None):
    """``args`` parsed exactly as a launch parses them, and checked for a job of ``world_size``
    processes."""
    return check(parse_job_config(args), world_size)


def use_local_assets(job_config) -> bool:
    """Point ``model.hf_assets_path`` at the local snapshot of a hub id, fetched now
    (``hf_assets``); whether it was one (a local path is used as it is)."""
    from dispersion_titan.tokenizer.hf_assets import is_hub_id, local_assets

    path = job_config.model.hf_assets_path
    if not is_hub_id(path):
        return False
    job_config.model.hf_assets_path = local_assets(path, "model.hf_assets_path")
    return True


def check_run_folder(job_config) -> None:
    """Refuse a relaunch that changes the recorded settings or would save over a step checkpoint
    (``run_folder.settings``, ``checkpoints.check_resume``); ``RunFinished`` when there is nothing to do."""
    from dispersion_titan.run_folder.checkpoints import check_resume
    from dispersion_titan.run_folder.settings import check_same_settings

    check_same_settings(job_config.job.dump_folder, job_config)
    ckpt = job_config.checkpoint
    if ckpt.enable:
        check_resume(os.path.join(job_config.job.dump_folder, ckpt.folder), job_config.training.steps,
                     _data_parallel_degree(job_config), ckpt.load_step)


def _data_parallel_degree(job_config) -> int:
    from dispersion_titan.trainer.config_checks import data_parallel_degree

    return data_parallel_degree(job_config, int(os.environ.get("WORLD_SIZE", "1")))


def use_fork(job_config) -> bool:
    """Set the checkpoint options that start a fork (``job.fork_from``) from its source; whether
    this run is one (``settings.start_fork``)."""
    from dispersion_titan.run_folder.settings import start_fork

    return start_fork(job_config, _data_parallel_degree(job_config))


def _launch_check_process() -> bool:
    """Whether this is the one process that checks a launch before its ranks start: not a torchrun
    rank (rank 0 takes the run folder's lock itself), and not one node of several, each of which
    checks the same folder while another node's rank 0 may already own it."""
    return "RANK" not in os.environ and os.environ.get("NNODES", "1") in ("", "1")


def _default_to_single_process() -> None:
    """Without torchrun, run as a 1-process job instead of failing on missing env vars."""
    if "LOCAL_RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(key, value)


def _stop_before_training(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM before the trainer installs its own handlers (``trainer/preemption.py``):
    one line instead of a KeyboardInterrupt traceback; nothing was saved yet."""
    if os.environ.get("RANK", "0") == "0":
        print("dispersion_titan: interrupted before training started; nothing saved", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)


def main() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):  # also where a background job inherited SIG_IGN
        signal.signal(signum, _stop_before_training)
    argv = sys.argv[1:]
    check_only = CHECK_ONLY in argv
    if any(a in HELP_FLAGS for a in argv):
        print(train_usage())
        return
    try:  # what needs no TorchTitan is checked before it is imported (seconds)
        toml = load_toml(argv)
        args = with_config_module([a for a in argv if a not in (CHECK_ONLY, HELP_ALL_FLAG)], toml)
        check_own_sections(toml, config_file(argv))
    except (ArgumentError, ConfigError) as e:
        fail_with(e)
    prepare()
    from dispersion_titan.components import titan_compat
    from dispersion_titan.run_folder.writer_lock import refuse_if_busy
    from dispersion_titan.utils.devices import check_gpus_usable

    if HELP_ALL_FLAG in argv:
        from torchtitan.config import ConfigManager

        ConfigManager().parse_args([*args, "--help"])  # prints the help of every section and exits
    try:
        job_config = validated_args(args)
        fetched, forked = use_local_assets(job_config), use_fork(job_config)
        if fetched or forked:
            check(job_config)  # now with the fetched tokenizer, or the fork's checkpoint
        check_gpus_usable()
        if _launch_check_process():
            refuse_if_busy(job_config.job.dump_folder)
        check_run_folder(job_config)
    except RunFinished as e:
        print(f"dispersion_titan: {e}", file=sys.stderr, flush=True)
        sys.exit(NOTHING_TO_DO if check_only else e.status)
    except (DispersionTitanError, ValueError) as e:
        fail(str(e).splitlines()[0])
    if check_only:
        return

    from dispersion_titan.trainer.preemption import secondary_failure_status
    from dispersion_titan.trainer.trainer import DispersionTrainer

    _default_to_single_process()
    try:
        titan_compat.train_main(DispersionTrainer, job_config)
    except DispersionTitanError as e:  # e.g. a hub dataset unreachable once the job runs
        fail_with(e)
    except Exception as e:
        status = secondary_failure_status(e)  # another rank failed first, or the job is being stopped
        if status is None:
            raise
        sys.exit(status)


if __name__ == "__main__":
    main()
