"""The MLP width × variant × seed experiment on Slurm (``python -m dispersion_titan.sweep``):
the sweep read and checked, every cell's training config validated, the jobs planned with
their dependencies, then printed (``--dry-run``) or submitted with ``sweep.json``."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import itertools
import json
import math
import os
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.arguments import input_options
from ..analysis.condensation_schema import RESULT_FILE as ANALYSIS_FILE
from ..analysis.condensation_schema import read_results
from ..components.optimizers import MOMENT_BYTES_PER_PARAM
from ..components.titan_compat import merged_job_config_class
from ..config.cli import CONFIG_MODULE, launch_args, link_loop, read_toml
from ..config.grid import BASELINE, GRID_KEYS, Arm, Cell, cells
from ..config.schema import BASELINE_METHODS
from ..evaluation.runner import OURS, check_include_path, read_evaluations, source_changed
from ..evaluation.runner import RESULT_FILE as EVALUATION_FILE
from ..job_config.parse import model_args, validated_args
from ..losses import VARIANTS
from ..run_folder.checkpoints import recorded_run, run_checkpoints, trained_to
from ..run_folder.owners import FolderOwner, empty, record_owner, refuse_unless_ours
from ..run_folder.settings import INPUT_PATHS, check_same_settings
from ..tokenizer.encoders import is_hub_id
from ..utils.errors import ArgumentError, ConfigError, DispersionTitanError
from ..utils.records import atomic_write
from .slurm_scripts import (
    SBATCH_GPUS_PER_NODE,
    SLURM_TIME,
    SlurmJob,
    check_train_time,
    compared,
    given_option,
    gpus_asked,
    gpus_environment,
    lead_told,
    option_values,
    queued_jobs,
    recorded_gpus,
    refuse_environment,
    refuse_options,
    refuse_other_gpus,
    sbatch,
    sbatch_count,
)

if TYPE_CHECKING:
    from ..config.schema import RunConfig

CPU_PROCESSES_PER_NODE = 2  # train.sh's NPROC without GPUs
MANIFEST = "sweep.json"


@dataclass
class Sweep:
    config: Path
    out: Path
    widths: list[int]
    variants: list[Arm]  # the sweep's key (a user's TOML key): the arms
    seeds: list[int]
    partition: str | None = None
    account: str | None = None
    train_time: str | None = None
    analyze_time: str | None = None
    evaluate_time: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None  # None: the sbatch script's own request
    cpus_per_task: int | None = None
    analyze_gpus: int | None = None
    train_sbatch_args: list[str] = field(default_factory=list)
    analyze_sbatch_args: list[str] = field(default_factory=list)
    evaluate_sbatch_args: list[str] = field(default_factory=list)
    train_overrides: list[str] = field(default_factory=list)
    analyze_args: list[str] = field(default_factory=list)
    evaluate_args: list[str] = field(default_factory=list)

    def cells(self) -> list[Cell]:
        return cells(self.widths, self.variants, self.seeds)


TIMES = ("train_time", "analyze_time", "evaluate_time")
RESOURCES = {"nodes": 1, "gpus_per_node": 0, "cpus_per_task": 1, "analyze_gpus": 0}  # each with its smallest value
ARGUMENTS = ("train_sbatch_args", "analyze_sbatch_args", "evaluate_sbatch_args", "analyze_args", "evaluate_args")


def _items(key: str, value: Any) -> list[Any]:
    """A TOML list, or a comma-separated string from the command line."""
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value:
        raise ArgumentError(f"{key}: expected a non-empty list, got {value!r}")
    return value


def _int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not re.fullmatch(r"-?\d+", str(value).strip()) or int(value) < minimum:
        raise ArgumentError(f"{key}: {value!r} is not an integer >= {minimum}")
    return int(value)


def parse_arm(text: str) -> Arm:
    """``baseline``, a baseline method, or ``NAME:COEFF`` with NAME a dispersion variant and COEFF > 0."""
    if text == BASELINE:
        return Arm("none", 0.0)
    if text in BASELINE_METHODS:
        return Arm("none", 0.0, method=text)
    name, sep, coeff = text.partition(":")
    if name not in VARIANTS:
        raise ArgumentError(
            f"variants: {text!r}: unknown variant (use baseline, {', '.join(BASELINE_METHODS)} or NAME:COEFF, "
            f"NAME one of {', '.join(VARIANTS)})"
        )
    try:
        value = float(coeff) if sep else None
    except ValueError:
        value = None
    if value is None or not 0 < value < math.inf:
        raise ArgumentError(f"variants: {text!r}: needs a finite coefficient > 0, as in {name}:0.1")
    return Arm(name, value)


def _strings(key: str, value: Any) -> list[str]:
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:  # an unclosed quote
            raise ArgumentError(f"{key}: {value!r}: {str(e).lower()}") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ArgumentError(f"{key}: expected a list of strings")
    return list(value)


def read_sweep(raw: dict[str, Any]) -> Sweep:
    allowed = set(Sweep.__dataclass_fields__)
    unknown = sorted(set(raw) - allowed)
    sections = [key for key, value in raw.items() if key not in allowed and isinstance(value, dict)]
    training = {f.name for f in dataclasses.fields(merged_job_config_class(CONFIG_MODULE))}
    if ours := [section for section in sections if section in training]:  # was `activation_checkpoint: unknown ...`
        raise ArgumentError(
            f"SWEEP.toml: a training config (its [{ours[0]}] section), not a sweep; a sweep's TOML names it as "
            'config = "CONFIG", as launch/sweep_example.toml does'
        )
    if sections:  # a [slurm] section: was taken for a training config's
        raise ArgumentError(
            f"SWEEP.toml: a TOML with a [{sections[0]}] section, which neither a sweep nor a training config has; a "
            "sweep's keys stand outside any section (partition = ..., as launch/sweep_example.toml has them)"
        )
    if unknown:
        raise ArgumentError(f"{unknown[0]}: unknown sweep key (known: {', '.join(sorted(allowed))})")
    for key in ("config", "widths", "variants", "seeds"):
        if raw.get(key) is None:
            raise ArgumentError(f"{key}: required (in the SPEC file or as --{key})")
    for key, what in (("config", "path"), ("out", "path"), ("partition", "name"), ("account", "name")):
        value = raw.get(key, "?")
        if not isinstance(value, str) or not value.strip():  # not sbatch's --partition=['a']
            raise ArgumentError(f"{key}: expected a {what} in quotes, got {value!r}")
        if what == "path" and (why := link_loop(os.path.expanduser(value))):  # Path.resolve raises RuntimeError
            raise ArgumentError(f"{key}: {why}")
    config = Path(raw["config"]).expanduser().resolve()
    read_toml(str(config), "config")  # missing, a folder, not TOML: named as the key, not as each cell's config_file
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(raw.get("out") or f"outputs/sweep-{config.stem}-{stamp}").expanduser().resolve()
    refuse_used(out)
    widths = [_int("widths", w, 1) for w in _items("widths", raw["widths"])]
    seeds = [_int("seeds", s, 0) for s in _items("seeds", raw["seeds"])]
    fields = {k: v for k, v in raw.items() if v is not None}
    fields.update({key: _int(key, fields[key], minimum) for key, minimum in RESOURCES.items() if key in fields})
    for key in TIMES:
        if key in fields and not SLURM_TIME.fullmatch(str(fields[key])):
            raise ArgumentError(
                f"{key}: {fields[key]!r} is not an sbatch --time (minutes, H:M:S or D-H:M:S, e.g. 2-00:00:00)"
            )
    fields.update({key: _strings(key, fields[key]) for key in (*ARGUMENTS, "train_overrides") if key in fields})
    for key in ("train_sbatch_args", "analyze_sbatch_args", "evaluate_sbatch_args"):  # a training job waits for none
        refuse_options(key, fields.get(key, []), waits=key != "train_sbatch_args")
    refuse_environment()
    if gpus := gpus_asked(fields.get("train_sbatch_args", [])):  # (a --gpus: refused by sbatch; a --gres: obeyed)
        raise ArgumentError(
            f"train_sbatch_args: {gpus}: the trainings ask train.sbatch's --gpus-per-node, which each cell's layout is "
            "checked for, and sbatch would read this with it; give their GPUs per node as --gpus-per-node N"
        )
    own = ("train_time", str(fields["train_time"])) if "train_time" in fields else None
    check_train_time(fields.get("train_sbatch_args", []), "train_sbatch_args", "--train-sbatch-arg", own)
    for arg in fields.get("train_overrides", []):  # --model.mlp-hidden-dim=5 is --model.mlp_hidden_dim to tyro
        if arg.startswith("--") and "--" + arg.split("=", 1)[0][2:].replace("-", "_") in GRID_KEYS:
            raise ArgumentError(f"training overrides: {arg} is set by the sweep for each cell")
    arms = [parse_arm(str(v)) for v in _items("variants", raw["variants"])]
    sweep = Sweep(**{**fields, "config": config, "out": out, "widths": widths, "seeds": seeds, "variants": arms})
    for key, values in (("widths", sweep.widths), ("seeds", sweep.seeds), ("variants", [a.label for a in arms])):
        if len(set(values)) != len(values):
            raise ArgumentError(f"{key}: listed twice: {values}")
    return sweep


TRAINING_PATHS = (*INPUT_PATHS, "checkpoint.initial_load_path", "model.tokenizer_path")
"""The training settings naming paths relative to the job's working directory (checkpoint.folder, the TensorBoard and
trace folders: to the run's)."""
JOB_PATHS = ("out", "tb_dir", "texts", "dataset_path", "include_path")  # analyze's and evaluate's options naming paths
SBATCH_PATHS = ("--output", "--error", "--input", "--export-file", "--nodefile")  # sbatch's (--chdir: refused)


def _paths(sweep: Sweep, options: dict[str, argparse.Namespace]) -> Iterator[tuple[str, str]]:
    """Each value of an option naming a path among the sweep's arguments, with its key (``options``: ``analyze_args``
    and ``evaluate_args`` as their jobs parse them)."""
    for key in ("train_sbatch_args", "analyze_sbatch_args", "evaluate_sbatch_args"):
        yield from ((key, value) for long in SBATCH_PATHS for _, value in option_values(getattr(sweep, key), long))
    for arg, after in itertools.pairwise([*sweep.train_overrides, ""]):  # --training.dataset-path is tyro's too
        name, eq, value = arg.partition("=")
        if name.startswith("--") and name[2:].replace("-", "_") in TRAINING_PATHS:
            yield "train_overrides", value if eq else after
    for key, parsed in options.items():
        yield from ((key, value) for dest in JOB_PATHS if (value := getattr(parsed, dest, None)))


def _matched(folder: str, path: str) -> bool:
    """A file or folder at ``path`` in ``folder``, or a glob's match there (``corpora.resolve_local_files``)."""
    return os.path.lexists(os.path.join(folder, path)) or bool(glob.glob(os.path.join(glob.escape(folder), path)))


def refuse_elsewhere(sweep: Sweep, options: dict[str, argparse.Namespace]) -> None:
    """The sweep submitted again from another folder than the first time (``sweep.json``'s ``work_dir``; an older one
    records none) with a relative path among its options' values (``--texts texts.jsonl``): its jobs run in the folder
    they are submitted from, where the same command strings name another file, or none. Only options that name paths
    count: ``--partition=gpu`` is no path, whatever either folder holds."""
    try:
        recorded = json.loads((sweep.out / MANIFEST).read_text()).get("work_dir")
    except (OSError, ValueError, AttributeError):  # none yet, or unreadable: resubmission says so
        return
    if not isinstance(recorded, str) or Path(recorded).resolve() == Path.cwd().resolve():
        return
    for key, value in _paths(sweep, options):
        paths = [path for path in value.split(",") if path and not path.startswith(("/", "~"))]  # data: paths, globs
        if path := next((p for p in paths if _matched(recorded, p) or _matched(".", p)), None):
            raise ArgumentError(
                f"{key}: {path}: a path relative to {recorded}, where {sweep.out} was first submitted from (its "
                "jobs read it from the folder they are submitted from, here another file or none); submit the "
                f"sweep again from {recorded}"
            )


def refuse_used(out: Path) -> None:
    """``out`` new, empty (as a refused submission leaves it) or a sweep's (submitted again: ``resubmission``; or its
    jobs queued with no sweep.json written, out of room: ``submit`` refuses to queue one twice)."""
    recorded = (out / MANIFEST).is_file() or (out / "logs" / "submitted.json").is_file()
    if out.exists() and not (out.is_dir() and (empty(str(out)) or recorded)):
        raise ArgumentError(f"out: {out} exists and is not an empty folder or a sweep's; give the sweep a new folder")
    refuse_unless_ours(str(out), FolderOwner("sweep"), "--out", "use another --out")  # inside a run: as submitting


def refuse_unreadable_inputs(options: dict[str, argparse.Namespace]) -> None:
    """The files the analyze and evaluate jobs read (``--texts``, ``--include-path`` ...), checked now as each job
    checks them, in its words: not in every job's failure after the trainings."""
    checks = {"analyze_args": input_options, "evaluate_args": lambda a: check_include_path(a.include_path)}
    for key, check in checks.items():
        try:
            check(options[key])
        except DispersionTitanError as e:
            raise ArgumentError(f"{key}: {e}") from None


def refuse_shared_folders(sweep: Sweep, options: dict[str, argparse.Namespace]) -> None:
    """An ``--out`` or ``--tb-dir`` in ``analyze_args``/``evaluate_args`` is one folder for every cell's job, and
    such a folder holds one run's results: each job after the first would be refused, hours from now."""
    if len(sweep.cells()) < 2:
        return
    for key, parsed in options.items():
        for option, default in (("out", "RUN/condensation"), ("tb_dir", "RUN/tb/condensation")):
            if (folder := getattr(parsed, option, None)) is not None:
                default = "RUN/evaluation" if key == "evaluate_args" else default
                raise ArgumentError(
                    f"{key}: --{option.replace('_', '-')} {folder} is one folder for the {len(sweep.cells())} "
                    f"cells' jobs, and it holds one run's results (each job after the first would be refused); "
                    f"leave it out: each cell's go into its run folder ({default})"
                )


def train_layout(sweep: Sweep) -> tuple[int, int]:
    """Each training job's nodes and GPUs per node as sbatch reads its options: the sweep's, then the last of its
    ``train_sbatch_args``, else the environment's (``SBATCH_GPUS_PER_NODE``), else train.sbatch's own."""
    args = [*_resources(sweep, "nodes", "gpus_per_node"), *sweep.train_sbatch_args]
    nodes = sbatch_count(args, "--nodes", 1, "train_sbatch_args", 1, "a training job needs a node; give at least 1")
    return nodes, sbatch_count(args, "--gpus-per-node", SBATCH_GPUS_PER_NODE, "train_sbatch_args", 0, "")


def world_size(sweep: Sweep) -> int:
    """The processes of each training job: one per GPU of every node."""
    nodes, per_node = train_layout(sweep)
    return nodes * (per_node or CPU_PROCESSES_PER_NODE)


def cell_args(sweep: Sweep, cell: Cell) -> list[str]:
    """The training command line of ``cell``, as its job runs it."""
    return launch_args(str(sweep.config), *sweep.train_overrides, *cell.overrides(str(sweep.out / cell.name)))


def check_training_configs(sweep: Sweep) -> list[RunConfig]:
    """Parse every cell's training configuration as the training entry point will, for
    the job's number of processes (batch sizes must split over its GPUs)."""
    configs, size, gpus_per_node = [], world_size(sweep), train_layout(sweep)[1]
    for cell in sweep.cells():
        try:
            configs.append(validated_args(cell_args(sweep, cell), size))
        except (DispersionTitanError, ValueError) as e:
            raise ArgumentError(f"cell {cell.name}: {str(e).splitlines()[0]}") from None
        unread = "its training would save no checkpoint for its analyze and evaluate jobs to read"  # (hours on)
        if not configs[-1].checkpoint.enable:
            raise ArgumentError(f"cell {cell.name}: checkpoint.enable is off: {unread}; leave it on")
        if not (configs[-1].training.steps or configs[-1].checkpoint.save_initial):
            raise ArgumentError(
                f"cell {cell.name}: training.steps is 0 without checkpoint.save_initial: {unread}; give it steps, or "
                "--checkpoint.save-initial"
            )
        compiled = configs[-1].compile.enable and configs[-1].compile.backend == "inductor"
        gpu_only = compiled or configs[-1].training.head_loss == "liger"
        if gpus_per_node == 0 and gpu_only:  # each training job's refusal, hours from now (titan_checks)
            raise ArgumentError(
                f"gpus_per_node: 0 trains on CPUs, and cell {cell.name}'s config compiles with inductor or runs "
                "liger's kernels for GPUs; give the training overrides --profile cpu (after --)"
            )
        pairs = configs[-1].dispersion
        if gpus_per_node == 0 and pairs.kernel == "triton" and pairs.variant != "none":
            raise ArgumentError(
                f"gpus_per_node: 0 trains on CPUs, and cell {cell.name}'s config runs the Triton pair kernel for "
                "GPUs (dispersion.kernel = 'triton'); give the training overrides --dispersion.kernel auto (after --)"
            )
    return configs


def refuse_beyond_memory(sweep: Sweep, configs: list[RunConfig], gpu: str, memory_gb: float) -> None:
    """A cell whose fp32 weights and Adam moments alone, shared by all of its job's GPUs, exceed the memory of ``gpu``
    (the largest a plan knows): its job would run out of memory hours from now. A floor, in microseconds a cell;
    ``sweep --plan`` measures each cell's whole step (seconds a cell). CPU jobs are not checked."""
    if train_layout(sweep)[1] == 0:
        return
    for cell, config in zip(sweep.cells(), configs, strict=True):
        args = model_args(config)
        params = args.least_parameters()
        shards = world_size(sweep) // config.parallelism.data_parallel_replicate_degree  # replicas hold copies
        need = params * (4 + MOMENT_BYTES_PER_PARAM) / shards
        if need > memory_gb * 1e9:
            raise ArgumentError(
                f"cell {cell.name}: {params:,} parameters or more (MLP width {args.value_of('mlp_hidden_dim'):,}, "
                f"dim {args.value_of('dim'):,}, {args.value_of('n_layers')} blocks), whose fp32 weights and Adam "
                f"moments alone need {need / 1e9:,.0f} GB on each of its job's {shards} GPUs, more than an {gpu} "
                "holds (the largest GPU a plan knows); give smaller widths (or a smaller model, or more --nodes); "
                "sweep --plan gives each cell's full plan"
            )


_RESULTS = {  # a job's results folder, its reader, whether one is of a checkpoint saved over since, its file
    "analyze": ("condensation", read_results, lambda r, path: r.changed(path), ANALYSIS_FILE),
    "evaluate": ("evaluation", read_evaluations, lambda r, path: source_changed(r[OURS], path), EVALUATION_FILE),
}


def _results(kind: str, run: str, options: argparse.Namespace) -> list[Path] | None:
    """The results of ``KIND RUN OPTIONS`` (analyze, evaluate), one per checkpoint it selects, as it reads them to
    skip (its settings are the sweep's, compared in ``sweep.json``); None while one is missing, or of a checkpoint
    saved over since."""
    folder, read, changed, file = _RESULTS[kind]
    try:
        dump, _, selected = run_checkpoints(run, "all" if options.steps is None else options.steps)
        out = options.out or os.path.join(dump, folder)
        found = read(out)
    except DispersionTitanError:  # the job itself says why
        return None
    if any(c.step not in found or changed(found[c.step], c.path) for c in selected):
        return None
    return [Path(out, f"step-{c.step}", file) for c in selected]


def _recorded(path: Path) -> tuple[str, list[str], dict[str, list[str]], dict[str, str], object]:
    """A submitted sweep's folder, its cells' names, its jobs' sbatch commands without their dependencies, the ids of
    those submitted (none: a submission refused partway, ``null``), and its ``environment`` (None: not recorded)."""
    try:
        manifest = json.loads(path.read_text())
        commands = {key: compared(argv) for key, argv in manifest["commands"].items()}
        ids = {}  # in the order submitted
        for i, cell in enumerate(manifest["cells"], start=1):
            ids |= {f"{kind}_{i}": cell[f"{kind}_job"] for kind in ("train", "analyze", "evaluate")}
        ids |= {"compare": manifest["compare_job"], "table": manifest["table_job"]}
        names = [cell["name"] for cell in manifest["cells"]]
        submitted = {key: job_id for key, job_id in ids.items() if job_id is not None}
        return manifest["out"], names, commands, submitted, manifest.get("environment")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # edited by hand, or of another version
        raise ArgumentError(f"out: {path}: unreadable ({type(e).__name__}: {e}); give the sweep a new folder") from None


def _refuse_other_settings(name: str, config: RunConfig) -> None:
    """A cell's training submitted again onto its run folder as its job will check it (``check_same_settings``): its
    config edited since the run saved a step is refused now, not when the job starts, hours from now."""
    if is_hub_id(config.model.hf_assets_path):  # compared once its job fetched the snapshot the run started from
        return
    dump = config.job.dump_folder
    try:
        check_same_settings(dump, recorded_run(dump), config)
    except ConfigError as e:
        line = str(e).splitlines()[0].split("; relaunch with the same settings")[0]
        raise ArgumentError(
            f"cell {name}: {line}; submit the sweep again with the settings its runs started with (its config as it "
            "was), or give the sweep a new folder"
        ) from None


def _refuse_while_queued_there(here: Path, there: str, ids: list[str], queued: dict[str, str]) -> None:
    """A sweep copied or moved from ``there`` while jobs of it (``ids``) are ``queued`` or running: they write there."""
    if not (jobs := " ".join(job_id for job_id in ids if job_id in queued)):  # all ended: this folder goes on alone
        return
    why = (
        f"copied or moved: its {MANIFEST}'s jobs write there); submit it there again, or give the sweep a new folder"
        if os.path.isdir(there)
        else f"moved: its jobs {jobs}, queued or running, write there); scancel {jobs} (or wait for them to end), "
        "then submit it here again"
    )
    raise ArgumentError(f"out: {here} holds the sweep submitted into {there} ({why}")


def _relocated(argv: list[str], there: str, here: str) -> list[str]:
    """A command recorded for the sweep in ``there`` as it reads for ``here``: the paths inside the folder, and the
    job name, which starts with the folder's name."""
    inside = re.compile(rf"(?<![^=]){re.escape(there)}(?=/|$)")  # the whole argument, or an option's value
    name, renamed = f"--job-name={Path(there).name}-", f"--job-name={Path(here).name}-"
    return [
        renamed + arg.removeprefix(name) if arg.startswith(name) else inside.sub(lambda _: here, arg) for arg in argv
    ]


def resubmission(
    sweep: Sweep,
    jobs: list[SlurmJob],
    configs: list[RunConfig],
    analyze: argparse.Namespace,
    evaluate: argparse.Namespace,
) -> tuple[list[SlurmJob], dict[str, str], set[str]]:
    """The sweep submitted into its folder: (the jobs to submit, the ids of those kept, the keys of those finished);
    into a new one, every job. Submitted again, with its settings, kept: the jobs Slurm still holds, and the finished:
    trainings that reached their last step, then their analyses and evaluations with a result of every checkpoint
    (none with ``--force``: it asks for them anew), and the compare and table jobs written after all of those; the
    others (cancelled, failed, or cancelled as a failed job's dependants) are submitted again, each command going on
    from what it finished."""
    if not (sweep.out / MANIFEST).exists():
        return jobs, {}, set()
    out, names, recorded, ids, environment = _recorded(sweep.out / MANIFEST)
    if out != str(sweep.out):  # copied or moved: compared as they would be submitted from here
        recorded = {key: _relocated(argv, out, str(sweep.out)) for key, argv in recorded.items()}
    cells = [cell.name for cell in sweep.cells()]
    if cells != names:  # an arm, width or seed added or dropped: each job's command would differ
        added, removed = [c for c in cells if c not in names], [c for c in names if c not in cells]
        changes = "; ".join(f"{what}: {', '.join(c)}" for what, c in (("added", added), ("removed", removed)) if c)
        raise ArgumentError(
            f"out: {sweep.out} holds a sweep of other cells ({changes or 'listed in another order'}); give the new "
            "grid a new sweep folder, or this one its own widths, variants and seeds to submit its stopped jobs again"
        )
    # a job never submitted (its sbatch refused, say for a bad partition) may take the settings that fix it
    differs = next((job.label for job in jobs if job.key in ids and recorded.get(job.key) != compared(job.argv)), None)
    if differs or len(recorded) != len(jobs):
        raise ArgumentError(
            f"out: {sweep.out} holds a sweep submitted with other settings (the {differs or 'grid'} job differs from "
            f"its {MANIFEST}); give the sweep a new folder, or its own settings to submit its stopped jobs again"
        )
    queued = queued_jobs(list(ids.values()))  # asked once: a job may end between two answers
    if out != str(sweep.out):
        _refuse_while_queued_there(sweep.out, out, list(ids.values()), queued)
    kept = {key: job_id for key, job_id in ids.items() if job_id in queued}
    results: dict[str, list[Path] | None] = {}
    for i, (cell, config) in enumerate(zip(sweep.cells(), configs, strict=True), start=1):
        ended = f"train_{i}" in ids and ids[f"train_{i}"] not in queued
        if ended and trained_to(os.path.join(config.job.dump_folder, config.checkpoint.folder), config.training.steps):
            run = str(sweep.out / cell.name)
            results |= {
                f"train_{i}": [],
                f"analyze_{i}": None if analyze.force else _results("analyze", run, analyze),
                f"evaluate_{i}": None if evaluate.force else _results("evaluate", run, evaluate),
            }
    written_last = {"compare": "compare.csv", "table": "table.md"}  # rewritten whole, after their inputs
    for job, file in ((job, written_last[job.key]) for job in jobs if job.key in written_last):
        inputs = [results.get(key) for key in job.after]
        written = sweep.out / job.key / file
        if None not in inputs and written.is_file():
            newest = max((p.stat().st_mtime for paths in inputs for p in paths), default=0)
            results[job.key] = [] if written.stat().st_mtime >= newest else None
    finished = {key for key, done in results.items() if done is not None and key in ids and ids[key] not in queued}
    kept |= {key: ids[key] for key in finished}
    todo = [job for job in jobs if job.key not in kept]
    if any(job.key.startswith("train_") and job.key in ids for job in todo):  # a training to go on
        given = given_option([*_resources(sweep, "gpus_per_node"), *sweep.train_sbatch_args], "--gpus-per-node")
        now = recorded_gpus(gpus_environment(), None)  # the variable's: the sweep's own, its commands compare
        refuse_other_gpus(
            recorded_gpus(environment, given), now, f"{sweep.out} holds a sweep", "give the sweep a new folder"
        )
    for i, (cell, config) in enumerate(zip(sweep.cells(), configs, strict=True), start=1):
        if any(job.key == f"train_{i}" for job in todo):
            _refuse_other_settings(cell.name, config)
    waits = {key for key in kept if ids[key] in queued} | {job.key for job in todo}  # a finished training: none
    return [replace(job, after=[key for key in job.after if key in waits]) for job in todo], kept, finished


def _resources(sweep: Sweep, *keys: str) -> list[str]:
    """sbatch options for the settings the sweep sets (``analyze_gpus`` is ``--gpus``)."""
    flags = {"analyze_gpus": "--gpus"}
    return [
        f"{flags.get(k, '--' + k.replace('_', '-'))}={getattr(sweep, k)}" for k in keys if getattr(sweep, k) is not None
    ]


def slurm_jobs(sweep: Sweep) -> list[SlurmJob]:
    """Per cell: train, then analyze and evaluate; then compare (after every train and
    analyze job) and the table (after every evaluate job)."""
    told = lead_told(sweep.train_sbatch_args)  # for train.sbatch's check of its time limit
    train_options = _resources(sweep, "nodes", "gpus_per_node", "cpus_per_task") + told + sweep.train_sbatch_args
    kinds = {  # a job's sbatch script is its kind's
        "train": (sweep.train_time, train_options),
        "analyze": (sweep.analyze_time, _resources(sweep, "analyze_gpus") + sweep.analyze_sbatch_args),
        "evaluate": (sweep.evaluate_time, sweep.evaluate_sbatch_args),
    }

    def job(key: str, label: str, kind: str, *args: str | Path, after: list[str], extra: tuple = ()) -> SlurmJob:
        time, options = kinds[kind]
        given = _resources(sweep, "partition", "account") + ([f"--time={time}"] if time else [])
        name = f"{sweep.out.name}-{label.replace(' ', '-')}"
        return SlurmJob(key, label, sbatch(name, sweep.out / "logs", [*given, *extra, *options], kind, args), after)

    jobs: list[SlurmJob] = []
    for i, cell in enumerate(sweep.cells(), start=1):
        run, name = str(sweep.out / cell.name), cell.name
        overrides = [*sweep.train_overrides, *cell.overrides(run)]
        train = job(f"train_{i}", f"{name} train", "train", sweep.config, *overrides, after=[])
        jobs += [
            train,
            job(f"analyze_{i}", f"{name} analyze", "analyze", run, *sweep.analyze_args, after=[train.key]),
            job(f"evaluate_{i}", f"{name} evaluate", "evaluate", run, *sweep.evaluate_args, after=[train.key]),
        ]
    runs = [str(sweep.out / cell.name) for cell in sweep.cells()]
    evaluations = [j.key for j in jobs if j.key.startswith("evaluate_")]
    others = [j.key for j in jobs if j.key not in evaluations]
    compare = job("compare", "compare", "analyze", "compare", *runs, "--out", sweep.out / "compare", after=others)
    # the table needs no GPU (a --gpus in evaluate_sbatch_args replaces ours)
    table_args = ("table", *runs, "--out", sweep.out / "table")
    gpus = () if given_option(sweep.evaluate_sbatch_args, "--gpus") else ("--gpus=0",)
    table = job("table", "table", "evaluate", *table_args, after=evaluations, extra=gpus)
    return [*jobs, compare, table]


def write_manifest(sweep: Sweep, jobs: list[SlurmJob], ids: dict[str, str]) -> Path:
    """``sweep.json``: the grid, its jobs' ids (``null``: not submitted, the same command again submits it) and
    sbatch commands, which a submission again compares."""
    manifest = {
        "config": str(sweep.config),
        "work_dir": str(Path.cwd()),  # the jobs' working directory: where their relative paths lead
        "out": str(sweep.out),
        "grid": {"widths": sweep.widths, "variants": [asdict(a) for a in sweep.variants], "seeds": sweep.seeds},
        "cells": [
            {
                "name": c.name,
                "width": c.width,
                "variant": asdict(c.arm),  # name, coeff, method
                "seed": c.seed,
                "run": str(sweep.out / c.name),
                **{f"{kind}_job": ids.get(f"{kind}_{i}") for kind in ("train", "analyze", "evaluate")},
            }
            for i, c in enumerate(sweep.cells(), start=1)
        ],
        "compare_job": ids.get("compare"),
        "compare_out": str(sweep.out / "compare"),
        "table_job": ids.get("table"),
        "table_out": str(sweep.out / "table"),
        "environment": gpus_environment(),  # the trainings' GPUs per node, by default
        "commands": {job.key: job.command(ids) if {job.key, *job.after} <= ids.keys() else job.argv for job in jobs},
    }
    path = sweep.out / MANIFEST
    atomic_write(str(path), lambda f: f.write(json.dumps(manifest, indent=2) + "\n"), durable=True)  # read again
    record_owner(str(sweep.out), FolderOwner("sweep"))  # its runs, comparison and table go inside
    return path
