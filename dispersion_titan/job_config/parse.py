"""Parse and check a launch's job config once, bad input in one line before any process group starts."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import os
import re
import shlex
from typing import TYPE_CHECKING

from torchtitan.protocols.train_spec import get_train_spec

from ..components import titan_compat
from ..config.cli import (
    CONFIG_MODULE,
    check_toml_types,
    config_file,
    given_keys,
    load_toml,
    read_toml,
    with_profile,
    without_profile,
)
from ..models import FAMILIES, register_all
from ..run_folder.checkpoints import check_resume, recorded_run, refuse_finished, saved_checkpoints
from ..run_folder.owners import refuse_other_owners
from ..run_folder.settings import check_same_settings, refuse_other_data_here, start_fork, started_revision
from ..run_folder.writer_lock import refuse_if_busy
from ..tokenizer.encoders import is_hub_id, local_assets
from ..utils.devices import check_gpus_usable
from ..utils.errors import ArgumentError, ConfigError, UnwritableFolderError
from ..utils.package_data import package_file
from .checks import check_job_config, data_parallel_degree
from .released import refuse_derived_keys
from .titan_checks import check_initial_load, check_runs_here, run_folders

if TYPE_CHECKING:
    from ..config.schema import RunConfig

SWITCH_WORDS = ("true", "false", "yes", "no", "on", "off", "1", "0")


def setup_torchtitan() -> None:
    """Check the TorchTitan version, adapt it to CPU-only machines, register our models."""
    titan_compat.apply()
    register_all()


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


_CHOICE = re.compile(r"invalid choice (.*) for argument '--([\w-]+)\.([\w-]+)'\. Expected one of (\(.*\))")
_PARSE = re.compile(r"Error parsing --([\w-]+)\.([\w-]+):")  # a value its type cannot parse
_MISSING = re.compile(r"Missing value for argument '--([\w-]+)\.([\w-]+)'")  # a flag last, or before a flag
_UNKNOWN = re.compile(r"Unrecognized options: ([^,]+)")  # tyro's ``Unrecognized options: --dispersion.coef, 1``


def _job_config_keys() -> dict[str, object]:
    """``section.key`` -> its type, of every JobConfig key (ours merged in)."""
    job_config = titan_compat.merged_job_config_class(CONFIG_MODULE)
    sections = [s for s in dataclasses.fields(job_config) if dataclasses.is_dataclass(s.type)]
    return {f"{s.name}.{k.name}": k.type for s in sections for k in dataclasses.fields(s.type)}


def _tyro_message(message: str, args: list[str]) -> str:
    """tyro's refusal said as the TOML check says it: an unknown option as an unknown key; a value's as the key
    typed in a config (``optimizer.decay_groups``, where tyro writes ``--optimizer.decay-groups``): a ``Literal``'s
    with its choices; one its type cannot parse (``invalid literal for int() with base 10``), or a flag without its
    value, with the value typed and the type expected (a value such as ``-run.toml``, which tyro reads as an option:
    its ``=`` form); first, a switch given a value (``--training.predict_last false``: tyro names the stray word)."""
    for flag, value in zip(args, args[1:]):
        key = flag.removeprefix("--").replace("-", "_")
        if flag.startswith("--") and _job_config_keys().get(key) in (bool, "bool") and value.lower() in SWITCH_WORDS:
            section, name = key.split(".", 1)
            on, off = f"--{section}.{name.replace('_', '-')}", f"--{section}.no-{name.replace('_', '-')}"
            return f"{flag} {value}: {key} is a switch and takes no value; write {on} for true, {off} for false"
    if unknown := _UNKNOWN.match(message):
        typed_key = unknown[1].removeprefix("--").partition("=")[0].replace("-", "_")
        close = difflib.get_close_matches(typed_key, list(_job_config_keys()), n=1)
        hint = f"did you mean --{close[0]}?" if close else "dispersion-titan train --help-all lists every key"
        return f"{unknown[1]}: unknown option; {hint}"
    if choice := _CHOICE.search(message):
        value, section, key, choices = choice.groups()
        return f"{section.replace('-', '_')}.{key.replace('-', '_')}: {value} is not one of {choices}"
    match = _PARSE.search(message) or _MISSING.search(message)
    if match is None:
        return message
    flag, key = f"--{match[1]}.{match[2]}", f"{match[1]}.{match[2]}".replace("-", "_")
    kind = _job_config_keys().get(key)
    words = set(re.findall(r"\w+", str(getattr(kind, "__name__", kind))))  # a class, a union or its text
    expected = "a number" if "float" in words else "an integer" if "int" in words else "a value"
    split = [(*arg.partition("="), after) for arg, after in zip(args, [*args[1:], ""])]  # the value: "=" or next
    if match.re is _MISSING:
        typed = [(k, after) for k, eq, _, after in split if k.replace("_", "-") == flag.replace("_", "-") and not eq]
        if typed and re.match("-[^-]", typed[-1][1]):  # a path such as -run.toml, read as an option
            given, value = typed[-1]
            return f"{key}: no value given ({value!r} is read as an option); write {shlex.quote(f'{given}={value}')}"
        return f"{key}: no value given; write {flag} followed by {expected}"
    typed = [v if eq else after for k, eq, v, after in split if k.replace("_", "-") == flag.replace("_", "-")]
    return f"{key}: {typed[-1]!r} is not {expected}" if typed else message


def warm() -> None:
    """One parse of the shipped debug config, in a process that then forks jobs (a job server's preload):
    every job's parse finds what it imports imported and the merged config class made (tyro clears its own
    caches at every parse)."""
    path = package_file("dispersion_titan", "train_configs", "debug.toml")
    titan_compat.config_manager_parse(["--job.custom_config_module", CONFIG_MODULE], read_toml(path, "debug.toml"))


def parse_job_config(args: list[str], toml: dict) -> RunConfig:
    """``args`` parsed by TorchTitan's ``ConfigManager`` with our sections on ``toml`` (already read, the
    ``--profile`` laid over it once its types are checked), tyro's boxed errors in one line."""
    check_toml_types(titan_compat.merged_job_config_class(CONFIG_MODULE), toml, config_file(args))
    toml = with_profile(args, toml)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            job_config = titan_compat.config_manager_parse(without_profile(args), toml)
    except SystemExit as e:  # tyro reports bad flags in a box of many lines
        boxed = captured.getvalue()
        raise ArgumentError(_tyro_message(_first_message(boxed), args)) from e
    except AssertionError as e:  # a TorchTitan section's __post_init__ (its one: validation.steps)
        raise ArgumentError(f"validation.steps: {e}") from None
    if "model.name" not in given_keys(args, toml):  # else TorchTitan's default llama3 would train
        source = config_file(args) or "no --job.config_file given"
        raise ConfigError(
            f"model.name: no model named ({source}); add [model] name = one of {FAMILIES} "
            '(e.g. train_configs/debug.toml\'s "gpt2"), or pass --model.name'
        )
    refuse_derived_keys(job_config, without_profile(args), toml)
    return job_config


def check(job_config: RunConfig, world_size: int | None = None) -> RunConfig:
    """``checks.check_job_config`` for ``world_size`` processes (default ``WORLD_SIZE``, else 1)."""
    check_job_config(job_config, model_args(job_config), _world_size(world_size))
    return job_config


def model_args(job_config: RunConfig):
    """The model family's flavor arguments with the ``[model]`` overrides applied."""
    ours = f"{job_config.model.name}_dispersion"
    if ours in FAMILIES:  # TorchTitan's own spec: without our data, tokenizer or loss
        raise ConfigError(
            f"model.name: {job_config.model.name!r} is TorchTitan's own spec, which trains without "
            f"dispersion_titan's data, tokenizer or dispersion term; use {ours!r}"
        )
    if job_config.model.name not in FAMILIES:
        raise ConfigError(f"model.name: {job_config.model.name!r} is not one of {FAMILIES}")
    register_all()
    flavors = get_train_spec(job_config.model.name).model_args
    if job_config.model.flavor not in flavors:
        raise ConfigError(
            f"model.flavor: {job_config.model.flavor!r} is not one of {sorted(flavors)} ({job_config.model.name})"
        )
    args = flavors[job_config.model.flavor]
    args.update_from_config(job_config)
    return args


def validated_args(args: list[str], world_size: int | None = None) -> RunConfig:
    """``args`` parsed and checked as a launch of ``world_size`` processes does (TorchTitan set up)."""
    setup_torchtitan()
    return check(parse_job_config(args, load_toml(args)), world_size)


def _world_size(world_size: int | None = None) -> int:
    return int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size


def fetch_local_assets(job_config: RunConfig, recorded: dict | None) -> bool:
    """Point ``model.hf_assets_path`` at a hub id's local snapshot, fetched now (a relaunch's: the revision its run,
    ``recorded``, started from); whether it was one."""
    path = job_config.model.hf_assets_path
    if not is_hub_id(path):
        return False
    revision = started_revision(job_config.job.dump_folder, recorded, path)
    job_config.model.hf_assets_path = local_assets(path, "model.hf_assets_path", revision)
    return True


def check_launch(job_config: RunConfig, take_lock: bool) -> RunConfig:
    """Everything a launch checks once ``job_config`` is parsed: its values (again with fetched assets
    or a fork's checkpoint), the GPUs, the writer lock (``take_lock``: the one checking process), the
    folders' owners; a relaunch that changes recorded settings or would save over a checkpoint is
    refused, ``RunFinished`` when there is nothing to do."""
    dump, ckpt = job_config.job.dump_folder, job_config.checkpoint
    recorded = recorded_run(dump)  # its run.json, read once for all the checks of a relaunch
    refuse_other_data_here(dump, recorded, job_config)
    unwritable = None
    try:
        check(job_config)
    except UnwritableFolderError as e:  # a finished run (a read-only mount's) has nothing to write: said finished
        if not ckpt.enable or recorded is None:  # below, if its settings are the run's (others were never run)
            raise
        unwritable = e
    dp = data_parallel_degree(job_config, _world_size())  # the layout: neither assets nor a fork change it
    fetched = fetch_local_assets(job_config, recorded)  # the settings are compared with these: its hub snapshot,
    forked = start_fork(job_config, recorded, dp)  # its fork's checkpoint
    if unwritable is None:  # a launch that goes on to train
        if fetched or forked:
            check(job_config)  # now with the fetched tokenizer, or the fork's checkpoint
        check_gpus_usable()
        check_runs_here(job_config)
        check_initial_load(job_config, model_args(job_config))
        if take_lock:
            refuse_if_busy(dump)
            recorded = recorded_run(dump)  # again, as the lock's holder: a launch that held it may have written it
        refuse_other_owners(dump, run_folders(job_config), forking=forked)
    check_same_settings(dump, recorded, job_config)
    folder, steps = os.path.join(dump, ckpt.folder), job_config.training.steps
    if unwritable is not None:
        refuse_finished(saved_checkpoints(folder), steps, ckpt.load_step)
        raise unwritable
    if ckpt.enable:
        check_resume(folder, dump, steps, dp, ckpt.load_step)
    return job_config
