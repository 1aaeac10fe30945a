"""Training entry point: ``torchrun … -m dispersion_titan.train --job.config_file X.toml``.

Validates the whole configuration first, so bad input fails with one line naming the
field before any process group starts; then hands over to ``torchtitan.train.main``.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import sys

from dispersion_titan.config.cli import load_toml, with_config_module
from dispersion_titan.errors import ArgumentError, ConfigError, DispersionTitanError, fail, fail_with


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
    from dispersion_titan.models import register_all
    from dispersion_titan.trainer import titan_compat

    titan_compat.apply()
    register_all()


def validated_args(args: list[str]):
    """Parse ``args`` exactly as TorchTitan will, and check every value we depend on."""
    from torchtitan.config import ConfigManager

    from dispersion_titan import config as custom_config
    from dispersion_titan.config.checks import check_job_config, check_toml_types
    from dispersion_titan.models.gpt2.args import gpt2_flavors
    from dispersion_titan.trainer import titan_compat

    toml = load_toml(args)
    check_toml_types(titan_compat.merged_job_config_class(custom_config.JobConfig), toml)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            job_config = ConfigManager().parse_args(args)
    except SystemExit as e:  # tyro reports bad flags in a box of many lines
        raise ArgumentError(_first_message(captured.getvalue())) from e
    if job_config.model.flavor not in gpt2_flavors:
        raise ConfigError(f"model.flavor: {job_config.model.flavor!r} is not one of {sorted(gpt2_flavors)}")
    model_args = gpt2_flavors[job_config.model.flavor]
    model_args.update_from_config(job_config)
    check_job_config(job_config, model_args)
    return job_config


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


def main() -> None:
    try:
        args = with_config_module(sys.argv[1:], load_toml(sys.argv[1:]))
    except ArgumentError as e:
        fail_with(e)
    prepare()
    from dispersion_titan.trainer import titan_compat

    titan_compat.use_command_line(args)
    if any(a in ("-h", "--help") for a in args):
        from torchtitan.config import ConfigManager

        ConfigManager().parse_args(args)  # prints the help of every section and exits
    try:
        validated_args(args)
    except (DispersionTitanError, ValueError) as e:
        fail(str(e).splitlines()[0])

    import torchtitan.train

    from dispersion_titan.trainer.trainer import DispersionTrainer

    _default_to_single_process()
    try:
        torchtitan.train.main(DispersionTrainer)
    except DispersionTitanError as e:  # e.g. a hub dataset unreachable once the job runs
        fail_with(e)


if __name__ == "__main__":
    main()
