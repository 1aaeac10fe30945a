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

from dispersion_titan.cli_args import ArgumentError, fail, load_toml, with_config_module


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


def validated_args(args: list[str]):
    """Parse ``args`` exactly as TorchTitan will, and check every value we depend on."""
    from torchtitan.config import ConfigManager, JobConfig

    from dispersion_titan import config as custom_config
    from dispersion_titan.config_checks import ConfigError, check_job_config, check_toml_types
    from dispersion_titan.models.gpt2.args import gpt2_flavors

    toml = load_toml(args)
    merged = ConfigManager._merge_configs(JobConfig, custom_config.JobConfig)
    check_toml_types(merged, toml)
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
        fail(str(e))
    sys.argv[1:] = args  # before TorchTitan is imported: it binds sys.argv at import time

    from dispersion_titan import compat, spec

    compat.apply()
    spec.register()
    if any(a in ("-h", "--help") for a in args):
        from torchtitan.config import ConfigManager

        ConfigManager().parse_args(args)  # prints the help of every section and exits
    from dispersion_titan.config_checks import ConfigError

    try:
        validated_args(args)
    except (ArgumentError, ConfigError, ValueError) as e:
        fail(str(e).splitlines()[0])

    import torchtitan.train

    from dispersion_titan.data.errors import DataConfigError
    from dispersion_titan.trainer import DispersionTrainer, NonFiniteLossError

    _default_to_single_process()
    try:
        torchtitan.train.main(DispersionTrainer)
    except DataConfigError as e:  # e.g. a hub dataset unreachable once the job runs
        fail(str(e).splitlines()[0])
    except NonFiniteLossError as e:
        fail(str(e), status=3)


if __name__ == "__main__":
    main()
