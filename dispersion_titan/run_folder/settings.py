"""A run folder's ledger in ``run.json``: its fixed settings, branching a new run from another on purpose
(``--job.fork_from RUN[@STEP]``, through TorchTitan's ``checkpoint.initial_load_path``), and where it
started. A relaunch may change only what leaves the trajectory as it is: an allow-list, so a key added
later is fixed. Table 2 tells mid-training from training from scratch by ``started_from``, as the
authors' two scripts do.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shlex
from typing import Any

from ..data.store import is_store, source_identity
from ..models.flavors import pretrained_folder
from ..tokenizer.encoders import TOKENIZER_FILE, hub_snapshot, is_hub_id, tokenizer_folder
from ..utils.errors import CheckpointError, ConfigError
from ..utils.records import flatten
from .checkpoints import (
    check_complete,
    check_loader_layout,
    checkpoint_identity,
    complete_checkpoints,
    find_checkpoint_folder,
    is_full,
    load_run_metadata,
    run_of,
    saved_nothing,
    tokenizer_sha256,
)
from .outputs import STEP_FOLDER, listed
from .owners import empty

ALLOWED_KEYS = frozenset({
    # where this launch reads its config from and writes to; fork_from is checked on its own
    "job.config_file", "job.dump_folder", "job.description", "job.print_config", "job.save_config_file",
    "job.custom_config_module", "job.fork_from",
    # how long to train, and how the same global batch is cut into micro-batches
    "training.steps", "training.local_batch_size", "training.max_local_batch_size", "training.gc_freq",
    "training.gc_debug",
    # when and how checkpoints are saved (never which one is loaded: see checkpoints.check_resume)
    "checkpoint.interval", "checkpoint.keep_latest_k", "checkpoint.last_save_model_only",
    "checkpoint.last_save_in_hf", "checkpoint.export_dtype", "checkpoint.async_mode", "checkpoint.load_step",
    "checkpoint.save_initial", "checkpoint.enable_first_step_checkpoint",
    # validation cadence and batching (not its data)
    "validation.enable", "validation.freq", "validation.steps", "validation.local_batch_size",
    "validation.global_batch_size",
    # the same dispersion term, and the same AdamW update, by another kernel
    "dispersion.kernel", "optimizer.implementation",
    "debug.deterministic", "debug.deterministic_warn_only",
})  # fmt: skip
"""Config keys a relaunch may change: none of them changes what the run computes."""

ALLOWED_SECTIONS = (
    "metrics.",
    "parallelism.",
    "activation_checkpoint.",
    "compile.",
    "comm.",
    "profiling.",
    "memory_estimation.",
    "training.dataloader.",
    "validation.dataloader.",
)
"""Whole sections a relaunch may change: logging, and how the same computation is laid out."""


INPUT_PATHS = ("training.dataset_path", "validation.dataset_path", "model.hf_assets_path")
"""Settings naming the run's data (or its tokenizer's folder) by a path or a pattern of them, relative to the
launch's working directory."""

DATA_IDENTITY = {
    "training.dataset_path": "training.dataset_identity",
    "validation.dataset_path": "validation.dataset_identity",
}
"""Beside each data path in the recorded settings, the documents it gave (``data.store.source_identity``): a
relaunch may name the same documents by another path (a token store moved or copied, the store of the corpus it
trained on, or back), and a token store prepared again from other inputs at the same path is refused. Not a config
key: ``fixed`` leaves it to ``check_same_settings``."""


def started_revision(dump_folder: str, recorded: dict[str, Any] | None, hub_id: str) -> str | None:
    """The revision of ``hub_id`` the run in ``dump_folder`` (its ``run.json``: ``recorded``) started from, which its
    relaunches read (the hub's main may have moved on since): None for a new run, or one from another model."""
    if recorded is None or saved_nothing(dump_folder, recorded):
        return None
    snapshot = hub_snapshot(recorded["settings"].get("model.hf_assets_path"))
    return snapshot[1] if snapshot and snapshot[0] == hub_id else None


def run_settings(job_config: Any) -> dict[str, Any]:
    """Every key of ``job_config`` as ``section.key``, JSON values, and the identity of its data (``DATA_IDENTITY``)."""
    settings = flatten(json.loads(json.dumps(job_config.to_dict(), default=str)))
    for path_key, identity_key in DATA_IDENTITY.items():
        section = path_key.split(".")[0]
        split = "train" if section == "training" else "validation"
        dataset, path = settings.get(f"{section}.dataset"), settings.get(path_key)
        if isinstance(dataset, str) and (path is None or isinstance(path, str)):
            settings[identity_key] = source_identity(dataset, split, path, path_key)
    return settings


def _compared(value: Any) -> Any:
    """A value as a relaunch compares it: a Hugging Face snapshot folder by its model and revision."""
    return hub_snapshot(value) or value


def _shown(value: Any) -> str:
    return "(unset)" if not isinstance(value, (str, int, float, bool, list, type(None))) else json.dumps(value)


def fixed(key: str) -> bool:
    """Whether a relaunch must keep ``key``: it changes what the run computes."""
    return key not in ALLOWED_KEYS and not key.startswith(ALLOWED_SECTIONS) and key not in DATA_IDENTITY.values()


def trajectory_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """Those of a run's recorded settings that fix what it computes (``fixed``), a hub snapshot as its model and
    revision: what runs of one configuration share."""
    return {key: _compared(value) for key, value in settings.items() if fixed(key)}


def check_same_settings(dump_folder: str, recorded: dict[str, Any] | None, job_config: Any) -> None:
    """Refuse, in one line listing the differing keys, a relaunch whose settings are not the recorded ones."""
    if recorded is None or saved_nothing(dump_folder, recorded):
        return
    before, now, missing = recorded["settings"], run_settings(job_config), object()
    # the same documents by another path (a store moved or copied, the store of the corpus, or back)
    same_data = {
        key for key, identity in DATA_IDENTITY.items() if before.get(identity) == now.get(identity) is not None
    }
    changes = [  # ``key old -> new`` outside the allow-list, a key one side lacks included
        f"{key} {_shown(before.get(key, missing))} -> {_shown(now.get(key, missing))}"
        for key in sorted(before.keys() | now.keys())
        if fixed(key)
        and key not in same_data
        and _compared(before.get(key, missing)) != _compared(now.get(key, missing))
    ]
    if changes:
        raise ConfigError(
            f"run folder {dump_folder} was started with other settings: {', '.join(changes)}; relaunch with the "
            "same settings, or branch on purpose with --job.fork_from RUN[@STEP] into a new --job.dump_folder"
        )
    # A tokenizer folder (the same path) replaced since the first launch would tokenize the rest of the data
    # otherwise (the weights come from the run's own checkpoint).
    folder = tokenizer_folder(now.get("model.name", ""), now.get("model.hf_assets_path"))
    first = recorded.get("tokenizer_sha256")
    if first and folder is not None and tokenizer_sha256(folder) not in (first, None):
        raise ConfigError(
            f"model.hf_assets_path: {folder}: its {TOKENIZER_FILE} (or its eos_token) is not the one run folder "
            f"{dump_folder} was started with (the folder replaced since?); put the run's tokenizer files back, or "
            "start a new run (another --job.dump_folder) with this one"
        )
    for key, identity in DATA_IDENTITY.items():
        if (
            now.get(key) == before.get(key)
            and is_store(now.get(key))
            and before.get(identity) not in (None, now.get(identity))
        ):
            raise ConfigError(
                f"{key}: token store {now[key]} holds other documents than run folder {dump_folder} trained on "
                "(prepared again since, from other inputs); put the run's store back there, or branch on purpose "
                "with --job.fork_from RUN[@STEP] into a new --job.dump_folder"
            )


def refuse_other_data_here(dump_folder: str, recorded: dict[str, Any] | None, job_config: Any) -> None:
    """Refuse a relaunch from another working directory where a relative data path, the same as recorded, names
    other files (or none) than it did from the run's first launch's. Files are told by content, so a copy of
    the first launch's folder relaunches; data no longer there is not told apart from data moved with it.
    Before the checks of the values, which named a path missing here as missing, not where to relaunch from, a data
    path gone (a token store moved) as one the corpus takes none of, and a tokenizer folder gone as one to give
    (another is refused as other settings)."""
    if recorded is None or saved_nothing(dump_folder, recorded):
        return
    first, now = recorded.get("cwd"), run_settings(job_config)
    if first and os.path.realpath(first) != os.path.realpath(os.getcwd()):
        for key in INPUT_PATHS:
            path = now.get(key)
            if not isinstance(path, str) or not path or os.path.isabs(os.path.expanduser(path)):
                continue
            if key == "model.hf_assets_path" and tokenizer_folder(now.get("model.name", ""), path) is None:
                continue  # gpt2's: its tokenizer is GPT-2's BPE, its folder read only for a first launch's weights
            there = _contents(first, path)
            if there and there != _contents(os.getcwd(), path):
                named = lambda root: sorted(map(os.path.realpath, glob.glob(os.path.join(root, path))))  # noqa: E731
                here = named(os.getcwd())
                raise ConfigError(
                    f"run folder {dump_folder} was first launched from {first}, where {key} {path!r} names "
                    f"{listed(named(first))}, {f'not {listed(here)} as from here' if here else 'nothing from here'}; "
                    f"relaunch from {first}"
                )
    for key in DATA_IDENTITY:
        path = now.get(key)
        same = path and path == recorded["settings"].get(key)  # its comma-separated paths and globs, all gone:
        if same and not any(glob.glob(os.path.expanduser(entry.strip())) for entry in path.split(",")):
            raise ConfigError(  # was the corpus's check: `'enwiki_sample' is embedded and takes no path`, for a store
                f"{key}: {path}: nothing there now, and run folder {dump_folder} trained on it; put it back there "
                "(a symbolic link to where it is now will do)"
            )
    folder = tokenizer_folder(now.get("model.name", ""), now.get("model.hf_assets_path"))
    gone = folder is not None and not os.path.isdir(os.path.expanduser(folder)) and not is_hub_id(folder)
    if gone and folder == recorded["settings"].get("model.hf_assets_path"):
        raise ConfigError(
            f"model.hf_assets_path: {folder}: no such folder, and run folder {dump_folder} takes its tokenizer from "
            "it; put it back there (a symbolic link to where it is now will do)"
        )


def _contents(root: str, pattern: str) -> list[tuple[str, int, str]]:
    """Each file ``pattern`` names from ``root`` (a folder's files within it): its path from ``root``, its size and
    a digest of its first and last 64 KiB; an unreadable file's digest is empty."""
    found = []
    for match in sorted(glob.glob(os.path.join(root, pattern))):
        walked = (os.path.join(folder, name) for folder, _, names in os.walk(match) for name in names)
        for file in sorted(walked) if os.path.isdir(match) else [match]:
            size, digest = os.path.getsize(file), hashlib.sha256()
            with contextlib.suppress(OSError), open(file, "rb") as f:
                digest.update(f.read(2**16))
                f.seek(max(size - 2**16, 0))
                digest.update(f.read())
            found.append((os.path.relpath(file, root), size, digest.hexdigest()))
    return found


def parse_fork(spec: str) -> tuple[str, int | None]:
    """``RUN`` or ``RUN@STEP`` as (run folder, step or None)."""
    run, at, step = spec.rpartition("@")
    if not at or os.path.isdir(spec):  # a run folder whose name holds '@' (lr@1e-3) is a run, not RUN@STEP
        return os.path.abspath(spec), None
    if not run or not step.isdigit():  # 'RUN@' and '@6' were read as RUN and as the working directory
        raise ConfigError(f"job.fork_from: {spec!r}: give RUN or RUN@STEP, STEP a checkpoint step number")
    return os.path.abspath(run), int(step)


def fork_source(spec: str) -> tuple[str, int, str]:
    """(source run, step, checkpoint) ``job.fork_from`` names: its step, else the newest full (or any) one."""
    run, step = parse_fork(spec)
    if glob.glob(os.path.join(run, "*.safetensors")):  # was `no checkpoints (no step-N folders here or in …)`
        raise ConfigError(
            f"job.fork_from: {run}: a Hugging Face model's folder, not a run; start from it with "
            f"--checkpoint.initial_load_path {shlex.quote(run)} --checkpoint.initial_load_in_hf"
        )
    try:
        folder = find_checkpoint_folder(run, give="{run}@{step}")
    except CheckpointError as e:
        raise ConfigError(f"job.fork_from: {e}") from None
    saved = complete_checkpoints(folder)
    if step is not None:
        path = os.path.join(folder, f"step-{step}")
        if not os.path.isdir(path):
            steps = ", ".join(str(c.step) for c in saved) or "none"
            raise ConfigError(f"job.fork_from: {path}: no such checkpoint (complete steps: {steps})")
        try:
            check_complete(path)
        except CheckpointError as e:
            raise ConfigError(f"job.fork_from: {e}") from None
        return run_of(folder), step, path
    if not saved:
        raise ConfigError(f"job.fork_from: {folder}: no complete checkpoint to fork from")
    chosen = ([c for c in saved if is_full(c.path)] or saved)[-1]
    return run_of(folder), chosen.step, chosen.path


def start_fork(job_config: Any, recorded: dict[str, Any] | None, data_parallel_degree: int) -> bool:
    """Set the checkpoint options that start this run from the one ``job.fork_from`` names (or the
    recorded one, on a relaunch), the run folder checked new or empty; whether there is a fork."""
    dump = os.path.abspath(job_config.job.dump_folder)
    anew = recorded is not None and saved_nothing(dump, recorded)
    earlier = (recorded or {}).get("forked_from")
    spec = job_config.job.fork_from
    if earlier is not None and not (anew and spec):  # a forked run relaunched goes on from the same checkpoint
        run, step = parse_fork(spec) if spec else (earlier["run"], None)
        if not _same_source(run, earlier) or step not in (None, earlier["step"]):
            raise ConfigError(
                f"job.fork_from: {dump} was forked from {earlier['run']}@{earlier['step']}, not {spec}; "
                "fork into a new --job.dump_folder"
            )
        source, step, path = earlier["run"], earlier["step"], earlier["checkpoint"]
        full = not earlier["model_only"]  # the source may be gone by now: its own checkpoints go on
    elif not spec:
        return False
    else:
        source, step, path = fork_source(spec)
        if source == dump:
            raise ConfigError(
                f"job.fork_from: {spec}: a run cannot be forked into its own folder; "
                "give the fork a new --job.dump_folder"
            )
        # Rank 0 looks before anything of this launch is written (other ranks may see rank 0's files); a run that
        # saved nothing is started anew.
        occupied = recorded is None and os.environ.get("RANK", "0") == "0" and not empty(dump)
        if occupied or (recorded is not None and not anew):
            raise ConfigError(
                f"job.fork_from: {dump} is not empty; a fork starts a new run, "
                "so give it a new or empty --job.dump_folder"
            )
        full = is_full(path)
        if full:
            check_loader_layout(path, data_parallel_degree)
    if not job_config.checkpoint.enable:
        raise ConfigError("job.fork_from: needs checkpoint.enable = true (the fork is loaded as a checkpoint)")
    if full and job_config.training.steps <= step:
        raise ConfigError(
            f"training.steps: {job_config.training.steps} does not go past step {step}, "
            f"where the fork from {source} starts"
        )
    job_config.job.fork_from = f"{source}@{step}"
    job_config.checkpoint.initial_load_path = path
    job_config.checkpoint.initial_load_model_only = not full
    job_config.checkpoint.initial_load_in_hf = False  # a DCP checkpoint, whatever the parent started from
    return True


def _same_source(run: str, earlier: dict[str, Any]) -> bool:
    """Whether ``run`` is the fork's recorded source: that folder, or one holding the same checkpoint."""
    if run == earlier["run"]:
        return True
    try:
        path = os.path.join(find_checkpoint_folder(run), f"step-{earlier['step']}")
        return checkpoint_identity(path) == earlier["identity"]
    except (CheckpointError, OSError):
        return False


def fork_record(job_config: Any) -> dict[str, Any] | None:
    """What ``run.json`` records of the checkpoint this run was forked from (None: not a fork)."""
    if not job_config.job.fork_from:
        return None
    run, step = parse_fork(job_config.job.fork_from)
    path = job_config.checkpoint.initial_load_path
    return {
        "run": run,
        "step": step,
        "checkpoint": path,
        "identity": checkpoint_identity(path),
        "model_only": job_config.checkpoint.initial_load_model_only,
    }


def fork_parent(job_config: Any) -> dict[str, Any] | None:
    """A fork's parent's recorded settings (the loaded data position counts the parent's sequences of its
    documents); None: not a fork, or a parent not of ours."""
    if job_config.job.fork_from:
        with contextlib.suppress(CheckpointError):
            return load_run_metadata(parse_fork(job_config.job.fork_from)[0]).get("settings") or {}
    return None


def same_documents(settings: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two runs' settings train on the same documents: by their identity where both have one (another path
    may name them), else by dataset and path."""
    key = DATA_IDENTITY["training.dataset_path"]
    if settings.get(key) and other.get(key):
        return settings[key] == other[key]
    return all(settings.get(k) == other.get(k) for k in ("training.dataset", "training.dataset_path"))


START_KEY = "started_from"


def start_record(job_config: Any) -> dict[str, Any]:
    """What the run loads before its first step, as TorchTitan's checkpointer decides it: ``source`` hf,
    checkpoint, seed_checkpoint or init; a fork started where its parent did."""
    if job_config.job.fork_from:
        with contextlib.suppress(CheckpointError):  # a parent not of ours: its checkpoint tells
            return load_run_metadata(parse_fork(job_config.job.fork_from)[0])[START_KEY]
    checkpoint = job_config.checkpoint
    if loaded := pretrained_folder(job_config):
        path = loaded[1]
        return {"pretrained": True, "source": "hf", "path": os.path.abspath(path) if os.path.isdir(path) else path}
    if checkpoint.enable and checkpoint.initial_load_path:
        seed = holds_an_initialisation(checkpoint.initial_load_path)
        return {
            "pretrained": not seed,
            "source": "seed_checkpoint" if seed else "checkpoint",
            "path": os.path.abspath(checkpoint.initial_load_path),
        }
    return {"pretrained": False, "source": "init", "path": None}


def holds_an_initialisation(step_dir: str) -> bool:
    """Whether a run's ``step-N`` holds an initialisation rather than trained weights (its run: ``run_of``)."""
    step_dir = os.path.abspath(step_dir)
    try:
        metadata = load_run_metadata(run_of(os.path.dirname(step_dir)))
    except CheckpointError:
        return False
    if (metadata.get("settings") or {}).get("checkpoint.create_seed_checkpoint"):
        return True
    match = STEP_FOLDER.match(os.path.basename(step_dir))
    return match is not None and int(match.group(1)) == 0 and from_scratch(metadata)


def from_scratch(metadata: dict[str, Any]) -> bool:
    """A run (its ``run.json``) that trains from an initialisation, not from pretrained weights."""
    return not metadata[START_KEY]["pretrained"]
