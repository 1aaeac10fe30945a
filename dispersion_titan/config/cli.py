"""Argument handling that must run before TorchTitan is imported."""

from __future__ import annotations

import argparse

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..utils.errors import ArgumentError, fail

CONFIG_MODULE = "dispersion_titan.config"  # TorchTitan's job.custom_config_module: our JobConfig

_CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")
_CUSTOM_MODULE_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in flags:
            if eq:
                return value
            if i + 1 < len(args):
                return args[i + 1]
            raise ArgumentError(f"{key}: missing value")
    return None


def load_toml(args: list[str]) -> dict:
    """The TOML named by ``--job.config_file`` ({} without one), with one-line errors."""
    path = _flag_value(args, _CONFIG_FILE_FLAGS)
    return {} if path is None else read_toml(path, "--job.config_file")


def read_toml(path: str, field: str) -> dict:
    """The TOML file at ``path``; errors are one line naming ``field`` and the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ArgumentError(f"{field}: {path}: no such file") from None
    except IsADirectoryError:
        raise ArgumentError(f"{field}: {path}: is a directory") from None
    except tomllib.TOMLDecodeError as e:
        raise ArgumentError(f"{field}: {path}: invalid TOML: {e}") from None


def with_config_module(args: list[str], toml: dict) -> list[str]:
    """Add ``--job.custom_config_module dispersion_titan.config`` unless CLI or TOML names one,
    so users' TOMLs may use ``[dispersion]`` and the extra ``[model]`` keys directly."""
    job = toml.get("job", {})
    if _flag_value(args, _CUSTOM_MODULE_FLAGS) or (isinstance(job, dict) and job.get("custom_config_module")):
        return args
    return [*args, _CUSTOM_MODULE_FLAGS[0], CONFIG_MODULE]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose usage errors end like every other error here: one line, exit 2."""

    error_prefix = "dispersion_titan"

    def error(self, message: str) -> None:
        fail(message, prog=self.error_prefix)


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


def add_device_arguments(parser: argparse.ArgumentParser, dtype_default: str | None = "fp32",
                         dtype_help: str = "model dtype (default fp32)") -> None:
    """``--device`` and ``--dtype`` of the commands that load checkpoints (``analysis.runner.resolve_device``)."""
    parser.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default=dtype_default, help=dtype_help)
