"""Argument handling that must run before TorchTitan is imported: the command line, its TOML (with a
``--profile`` laid over it), and that TOML's keys and types against the JobConfig dataclasses, which
TorchTitan does not check (``train`` checks our own sections so before it is imported)."""

from __future__ import annotations

import argparse
import codecs
import dataclasses
import difflib
import errno
import os
import re
import stat
import sys
import types
import typing
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ..utils.errors import ArgumentError, ConfigError, docs_page, fail
from ..utils.package_data import package_file
from .schema import JobConfig

CONFIG_MODULE = "dispersion_titan.config"  # TorchTitan's job.custom_config_module: our JobConfig

_CONFIG_FILE_FLAGS = ("--job.config_file", "--job.config-file")
_CUSTOM_MODULE_FLAGS = ("--job.custom_config_module", "--job.custom-config-module")
PROFILE_FLAG = "--profile"
PROFILES = {"cpu": "cpu_profile.toml"}
"""``--profile NAME``: a TOML of keys laid over the config file's (``dispersion_titan/configs/``)."""


def _flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the one flag of ``flags`` in ``args``; given twice, the user meant one of them."""
    found = []
    for i, arg in enumerate(args):
        key, eq, value = arg.partition("=")
        if key in flags:
            if not eq and i + 1 == len(args):
                raise ArgumentError(f"{key}: missing value")
            found.append(value if eq else args[i + 1])
    if len(found) > 1:
        raise ArgumentError(f"{flags[0]}: given {len(found)} times ({', '.join(found)}); give it once")
    return found[0] if found else None


def config_file(args: list[str]) -> str | None:
    return _flag_value(args, _CONFIG_FILE_FLAGS)


def load_toml(args: list[str]) -> dict:
    """The TOML named by ``--job.config_file`` ({} without one), as the file has it: its values are checked
    before ``with_profile`` lays the ``--profile``'s over them (and would hide a bad one); one-line errors."""
    path = config_file(args)
    return {} if path is None else read_toml(path, "--job.config_file")


def with_profile(args: list[str], toml: dict) -> dict:
    """``toml`` with the ``--profile``'s keys laid over it, section by section."""
    name = _flag_value(args, (PROFILE_FLAG,))
    if name is None:
        return toml
    if name not in PROFILES:
        raise ArgumentError(f"{PROFILE_FLAG}: {name!r} is not one of {tuple(PROFILES)}")
    profile = package_file("dispersion_titan", "configs", PROFILES[name])
    laid = dict(toml)
    for section, keys in read_toml(profile, PROFILE_FLAG).items():
        own = toml.get(section)
        laid[section] = {**(own if isinstance(own, dict) else {}), **keys}
    return laid


def without_profile(args: list[str]) -> list[str]:
    """``args`` less ``--profile NAME`` (``with_profile`` lays it over the TOML; TorchTitan has no such key)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == PROFILE_FLAG:
            skip = True
        elif not arg.startswith(PROFILE_FLAG + "="):
            out.append(arg)
    return out


HELP_FLAGS = ("-h", "--help")
HELP_ALL_FLAG = "--help-all"


def train_usage() -> str:
    """``train --help``, without importing TorchTitan."""
    sections = "\n".join(
        f"  [{section.name}] " + " ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(section.type))
        for section in dataclasses.fields(JobConfig)
    )
    return f"""usage: python -m dispersion_titan.train --job.config_file FILE.toml [--SECTION.KEY VALUE ...]
                                       [--profile cpu] [--check-only]
       bash launch/train.sh FILE.toml [--SECTION.KEY VALUE ...]   (torchrun on this node's GPUs)

Trains with TorchTitan. Every key of FILE.toml, TorchTitan's and ours, can be overridden
on the command line as --SECTION.KEY VALUE.

  --check-only  check the configuration for WORLD_SIZE processes, say what the launch derives, and stop
  --profile cpu the CPU settings laid over FILE.toml: no compile, foreach AdamW, micro-batches of 1
  {HELP_ALL_FLAG}    every section and key with its default and description (imports TorchTitan)

Keys this package adds, with their defaults:
{sections}

Documentation: {docs_page("training.md")}"""


def read_toml(path: str, field: str) -> dict:
    """The TOML file at ``path``; errors are one line naming ``field`` and the file. A pipe (``<(...)``,
    ``/dev/stdin``) is refused: it holds the text for the first read only, and a launch reads it again; checked
    before it is opened, which waits for a writer to a named pipe."""
    if not path:  # an unset shell variable: was `FIELD: : no such file`
        raise ArgumentError(f"{field}: empty; name a TOML file")
    if why := link_loop(path):
        raise ArgumentError(f"{field}: {why}")
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) and not os.path.isdir(path):
            raise ArgumentError(f"{field}: {path} is no file but a pipe or device, read once; save it to a file")
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        # a shipped config's name, typed in a folder without them
        shipped = Path(path).parts[:1] == ("train_configs",) and not os.path.isdir("train_configs")
        hint = f" here ({os.getcwd()}); dispersion-titan init DIR writes the shipped configs, then run in DIR"
        raise ArgumentError(f"{field}: {path}: no such file{hint if shipped else ''}") from None
    except IsADirectoryError:
        raise ArgumentError(f"{field}: {path} is a folder; give the TOML file itself") from None
    except tomllib.TOMLDecodeError as e:
        with open(path, "rb") as f:
            if f.read(3) == codecs.BOM_UTF8:  # "UTF-8 with BOM": tomllib says "Invalid statement"
                raise ArgumentError(
                    f"{field}: {path}: starts with a byte order mark (BOM), which TOML does not allow; "
                    "save it as UTF-8 without BOM"
                ) from None
        raise ArgumentError(f"{field}: {path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ArgumentError(
            f"{field}: {path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "save the TOML file as UTF-8"
        ) from None


def given_keys(args: list[str], toml: dict) -> set[str]:
    """``section.key`` of every key the TOML sets or the command line passes."""
    keys = {f"{s}.{k}" for s, values in toml.items() if isinstance(values, dict) for k in values}
    for arg in args:
        if match := re.fullmatch(r"--([\w-]+)\.([\w-]+)(=.*)?", arg):
            section, key = match.group(1).replace("-", "_"), match.group(2).replace("-", "_")
            keys.add(f"{section}.{key.removeprefix('no_')}")
    return keys


def with_config_module(args: list[str], toml: dict) -> list[str]:
    """Add ``--job.custom_config_module dispersion_titan.config`` unless CLI or TOML names one."""
    job = toml.get("job", {})
    if _flag_value(args, _CUSTOM_MODULE_FLAGS) or (isinstance(job, dict) and job.get("custom_config_module")):
        return args
    return [*args, _CUSTOM_MODULE_FLAGS[0], CONFIG_MODULE]


def launch_args(config: str, *overrides: str) -> list[str]:
    """The command line of a launch of ``config`` with ``overrides`` (``with_config_module``)."""
    args = ["--job.config_file", config, *overrides]
    return with_config_module(args, load_toml(args))


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose usage errors end like every other error here: one line, exit 2; one of a path that starts
    with a dash (``init -x``: ``required: DIR``) says how to write it."""

    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """A missing subcommand said as ``dispersion-titan`` says a missing command (was argparse's `the following
        arguments are required: to-hf`, which names no command to give): checked after parsing, so --help answers."""
        self._argv = list(sys.argv[1:] if args is None else args)
        required = [
            a
            for a in self._actions
            if isinstance(a, argparse._SubParsersAction) and a.required and a.dest != argparse.SUPPRESS
        ]
        for action in required:
            action.required = False
        try:
            parsed, extras = super().parse_known_args(args, namespace)
        finally:
            for action in required:
                action.required = True
        if any(getattr(parsed, action.dest, None) is None for action in required):
            self.error(f"name a command; {self._commands(required[0])}")
        return parsed, extras

    def _commands(self, action: argparse._SubParsersAction) -> str:
        return f"{self.prog}'s commands: {', '.join(action.choices)} (each command's --help says more)"

    def _check_value(self, action: argparse.Action, value: str) -> None:
        """An unknown subcommand said as ``dispersion-titan`` says an unknown command (was argparse's `argument
        to-hf: invalid choice: 'from-hf' (choose from 'to-hf')`, which reads as a fault of to-hf)."""
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            raise argparse.ArgumentError(None, f"unknown command {value!r}; {self._commands(action)}")
        super()._check_value(action, value)

    def error(self, message: str) -> None:
        dashed = [
            arg
            for arg in self._argv
            if re.match("-[^-]", arg)
            and arg.partition("=")[0] not in self._option_string_actions
            and not self._negative_number_matcher.match(arg)
        ]
        fail(f"{message} ({dashed[0]!r} is read as an option: write a path that starts with a dash as ./{dashed[0]})"
             if dashed else message)  # fmt: skip


def link_loop(path: str) -> str | None:
    """Why ``path`` names nothing: a symbolic link on it that leads back to itself (``ln -s a b; ln -s b a``), which
    each open would meet mid-command; None when it has none."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"{path} goes through a symbolic link that loops ({e.strerror}); fix the link, or give another path"
    return None


def folder_problem(path: str, unexpanded_by: str) -> str | None:
    """Why ``path`` may not name a folder: a control character in it (a newline, a tab pasted with it), which would
    make a folder ``ls`` and the shell show otherwise than typed; a leading ``~`` that ``unexpanded_by`` leaves as it
    is, so a folder named ``~`` would be made in the working directory; ``link_loop``; None when it has none."""
    if found := next((c for c in path if unicodedata.category(c) == "Cc"), None):
        return f"{path!r} holds the control character {found!r}; give a folder name without it"
    if path.startswith("~"):
        return (
            f"{path} starts with ~, which {unexpanded_by} (a folder named ~ would be made in {os.getcwd()}); write it "
            f"as {os.path.expanduser(path)}"
        )
    return link_loop(path)


def out_folder(text: str) -> str:
    """An output folder option's value: no control character, no quoted ``~`` (the launch's ``job.dump_folder`` is
    refused alike)."""
    if why := folder_problem(text, "the shell expands only unquoted"):
        raise argparse.ArgumentTypeError(why)
    return text


def named_out(text: str) -> str:
    """``out_folder`` of an option with a default: an empty value (an unset shell variable) refused, not read as the
    working directory."""
    return out_folder(named("a folder, or leave the option out for its default")(text))


def named(what: str) -> Callable[[str], str]:
    """The type of an argument naming a file, folder, model or dataset: an empty value (an unset shell variable)
    refused as ``empty; name WHAT``, not read as the working directory or as the option left out."""

    def given(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"empty; name {what}")
        return text

    return given


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    if int(text) > sys.maxsize:  # a count, a size: beyond what Python indexes (islice's bound)
        raise argparse.ArgumentTypeError(f"{text!r} is more than {sys.maxsize}")
    return int(text)


def non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a non-negative integer")
    return int(text)


def add_results_arguments(parser: argparse.ArgumentParser, verb: str, results: str) -> None:
    """``--force`` and ``--wandb`` of ``analyze`` and ``evaluate``."""
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"{verb} the selected steps anew, also into an --out holding other settings",
    )
    parser.add_argument(
        "--wandb",
        action="store_true",
        help=f"also log the {results} to the run's W&B run (trained with [metrics] enable_wandb)",
    )


def device_name(text: str) -> str:
    """``--device`` as torch reads it (``cuda:x`` is refused by the parser, the dry runs too)."""
    import torch

    try:
        torch.device(text)
    except RuntimeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_device_arguments(
    parser: argparse.ArgumentParser,
    dtype_help: str,
    dtype_default: str | None = "fp32",
    dtypes: tuple[str, ...] = ("fp32", "bf16"),
) -> None:
    """``--device`` and ``--dtype`` of the commands that load checkpoints (``utils.devices.resolve_device``)."""
    parser.add_argument("--device", type=device_name, help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=dtypes, default=dtype_default, help=dtype_help)


def _matches(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True  # annotations we do not model are left to TorchTitan


def check_toml_types(config_cls: type, values: dict[str, Any], source: str, prefix: str = "") -> None:
    """Every key of ``values`` (from ``source``) is a field of ``config_cls`` with a value of its type."""
    hints = typing.get_type_hints(config_cls)
    known = {f.name for f in dataclasses.fields(config_cls)}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if key not in known and not prefix and not isinstance(value, dict):  # a sweep's TOML, say
            raise ConfigError(
                f"{name}: a key outside any [section] in {source}; a training config keeps its keys in sections "
                "([job], [model], [training], ...)"
            )
        if key not in known:
            what = "key" if prefix else "section"
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else ""
            raise ConfigError(f"{name}: unknown {what} in {source}{hint}")
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: expected a [{name}] table, got {value!r} (in {source})")
            check_toml_types(annotation, value, source, prefix=f"{name}.")
        elif not _matches(value, annotation):
            if typing.get_origin(annotation) is Literal:
                raise ConfigError(f"{name}: {value!r} is not one of {typing.get_args(annotation)} (in {source})")
            expected = getattr(annotation, "__name__", str(annotation))
            raise ConfigError(f"{name}: expected {expected}, got {value!r} (in {source})")
