"""What TorchTitan 0.2.2 (or torch's AdamW) would crash on only once the job runs, refused before in one
line naming the key; at launch only, what a new run loads first and what this machine cannot run."""

from __future__ import annotations

import glob
import os
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..components import wandb_run
from ..components.titan_compat import model_converter_names
from ..config.cli import folder_problem
from ..data.corpora import check_readable_here
from ..data.store import is_store
from ..run_folder.checkpoints import complete_checkpoints
from ..run_folder.owners import RUN_METADATA_FILE, RUN_PATH_KEYS, inside
from ..tokenizer.encoders import is_hub_id
from ..utils.errors import CheckpointError, ConfigError, DataConfigError, UnwritableFolderError
from .hf_weights import check_dcp_weights, check_hf_weights

if TYPE_CHECKING:
    from ..config.schema import RunConfig


def check_checkpoint(config: RunConfig, world_size: int) -> None:
    c = config.checkpoint
    if c.create_seed_checkpoint and (world_size != 1 or not c.enable):
        raise ConfigError(
            "checkpoint.create_seed_checkpoint: needs one process (NPROC=1) and checkpoint.enable, "
            f"got {world_size} processes and enable = {c.enable}"
        )
    if c.save_initial and c.keep_latest_k > 0:
        raise ConfigError(
            "checkpoint.keep_latest_k: must be 0 with checkpoint.save_initial, "
            "or TorchTitan deletes the step-0 checkpoint"
        )
    if c.enable and c.keep_latest_k == 1:
        raise ConfigError(
            "checkpoint.keep_latest_k: 1 is refused by TorchTitan (the newest may still be saving); "
            "use 0 to keep every checkpoint, or 2 or more"
        )
    if c.enable and c.last_save_in_hf and not c.last_save_model_only:
        raise ConfigError(
            "checkpoint.last_save_model_only: must be true with checkpoint.last_save_in_hf (TorchTitan saves "
            "weights only as safetensors)"
        )
    if c.enable and c.initial_load_path == "" and not c.initial_load_in_hf:  # an unset "$CKPT": was from scratch
        raise ConfigError(
            "checkpoint.initial_load_path: empty; name the checkpoint to start from, or leave it out to train from "
            "scratch"
        )


def check_initial_load(config: RunConfig, args: Any) -> None:
    """What the checkpointer loads before a new run's first step (``checkpoint.initial_load_*``), looked
    at as it will look (a relaunch loads its own checkpoints); ``args``: the model's, which Hugging Face
    weights must fit."""
    c = config.checkpoint
    folder = os.path.join(config.job.dump_folder, c.folder)
    if not c.enable:
        return
    if os.path.exists(folder):  # TorchTitan loads from it, and from nothing else: a start died before its first save
        if (c.initial_load_path or c.initial_load_in_hf) and not complete_checkpoints(folder):
            raise CheckpointError(
                f"{folder}: holds no complete checkpoint, and TorchTitan would then start from a fresh initialisation, "
                "not from checkpoint.initial_load_*; move it aside (nothing in it is loaded) and relaunch"
            )
        return
    if c.initial_load_in_hf_quantized:  # our gpt2 reader raised in every rank; TorchTitan's qwen3, llama3 ones warn
        raise ConfigError(
            f"checkpoint.initial_load_in_hf_quantized: {config.model.name} loads no quantized Hugging Face "
            "checkpoint; set it false"
        )
    if c.initial_load_in_hf and not c.initial_load_model_only:
        raise ConfigError(
            "checkpoint.initial_load_model_only: must be true with checkpoint.initial_load_in_hf "
            "(Hugging Face safetensors hold weights only)"
        )
    hf = c.initial_load_in_hf
    if c.initial_load_path:
        key, path = "checkpoint.initial_load_path", c.initial_load_path
    elif hf and not is_hub_id(config.model.hf_assets_path):
        key, path = "checkpoint.initial_load_in_hf", config.model.hf_assets_path
    else:
        return
    if glob.glob(os.path.join(path, "*.safetensors" if hf else ".metadata")):
        if hf:
            check_hf_weights(config, args, key if c.initial_load_path else "model.hf_assets_path", path)
        else:
            check_dcp_weights(config, args, "job.fork_from" if config.job.fork_from else key, path)
        return
    problem = "no such folder" if not os.path.isdir(path) else f"no {'*.safetensors' if hf else '.metadata'} in it"
    if key == "checkpoint.initial_load_in_hf":
        raise ConfigError(
            f"checkpoint.initial_load_in_hf: true loads Hugging Face weights from model.hf_assets_path {path} "
            f"when checkpoint.initial_load_path is empty ({problem}); give model.hf_assets_path the model's folder "
            "or hub id, or set initial_load_in_hf = false to train from scratch"
        )
    if glob.glob(os.path.join(path, ".metadata" if hf else "*.safetensors")):  # the other kind: said, not "no X"
        flag = "false: it is a DCP checkpoint" if hf else "true: it is a Hugging Face model's folder"
        raise ConfigError(f"{key}: {path}: set checkpoint.initial_load_in_hf = {flag}")
    if not hf and os.path.isfile(os.path.join(path, RUN_METADATA_FILE)):
        raise ConfigError(
            f"{key}: {path}: a run's folder; give one of its checkpoints' step-N folders, or branch from it with "
            "--job.fork_from RUN[@STEP]"
        )
    what = "a Hugging Face model's folder (its *.safetensors)" if hf else "a checkpoint's step-N folder"
    raise ConfigError(f'{key}: {path}: {problem}; give {what}, or "" to train from scratch')


def check_runs_here(config: RunConfig) -> None:
    """A GPU config where torch sees no GPU is refused at launch, never changed silently (``plan`` and the sweep
    check it on a login node without one): inductor (on a CPU it needs a C++ toolchain and minutes per start),
    liger and the Triton pair kernel; a hub dataset this machine cannot read."""
    for section in ("training", "validation") if config.validation.enable else ("training",):
        cfg = getattr(config, section)
        if not is_store(cfg.dataset_path):
            try:
                check_readable_here(cfg.dataset, cfg.dataset_path, f"{section}.dataset")
            except DataConfigError as e:
                raise ConfigError(str(e)) from None

    c = config.compile
    if c.enable and c.backend == "inductor" and not torch.cuda.is_available():
        raise ConfigError(
            "compile.enable: true compiles with inductor for GPUs and torch sees none here; "
            "run CPU jobs with --profile cpu (compile off, foreach AdamW: the same computation)"
        )
    if config.training.head_loss == "liger" and not triton_device_here():
        raise ConfigError('training.head_loss: "liger" runs Triton kernels, and torch sees no GPU here; use "torch"')
    d = config.dispersion
    if d.kernel == "triton" and d.variant != "none" and not triton_device_here():
        raise ConfigError(
            "dispersion.kernel: 'triton' needs a CUDA GPU, and torch sees none here; "
            "use 'auto' (the PyTorch strips on CPU) or 'torch'"
        )


def triton_device_here() -> bool:
    """Whether the Triton kernels can run in this job: a CUDA device, or Triton's CPU interpreter."""
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def check_titan_settings(config: RunConfig) -> None:
    """Settings TorchTitan types as free text or numbers and takes apart only once the job runs."""
    p = config.profiling
    if p.enable_profiling and p.profile_freq < p.profiler_warmup + p.profiler_active:
        raise ConfigError(
            f"profiling.profile_freq: {p.profile_freq} is less than profiler_warmup + profiler_active = "
            f"{p.profiler_warmup + p.profiler_active} steps"
        )
    ac = config.activation_checkpoint
    if ac.mode == "selective" and ac.selective_ac_option != "op" and not ac.selective_ac_option.isdigit():
        raise ConfigError(
            f"activation_checkpoint.selective_ac_option: {ac.selective_ac_option!r}; use 'op' or a number of layers"
        )
    if unknown := [name for name in config.model.converters if name not in model_converter_names()]:
        raise ConfigError(
            f"model.converters: {unknown[0]!r} is not one of TorchTitan 0.2.2's {sorted(model_converter_names())}"
        )
    if config.metrics.enable_wandb and (why := wandb_run.unusable()):
        raise ConfigError(
            f"metrics.enable_wandb: {why}" + (", or set it false" if why == wandb_run.NOT_INSTALLED else "")
        )


def run_folders(config: RunConfig) -> dict[str, str]:
    """Every folder TorchTitan writes for this run, by config key, joined to ``job.dump_folder``."""
    written = {
        "checkpoint.folder": config.checkpoint.enable,
        "metrics.save_tb_folder": config.metrics.enable_tensorboard or config.metrics.enable_wandb,
        "comm.save_traces_folder": config.comm.trace_buf_size > 0,
        "profiling.save_traces_folder": config.profiling.enable_profiling,
        "profiling.save_memory_snapshot_folder": config.profiling.enable_memory_snapshot,
    }
    return {key: os.path.join(config.job.dump_folder, attrgetter(key)(config)) for key, on in written.items() if on}


def check_output_folders(config: RunConfig) -> None:
    """Every folder the run writes to; the config file TorchTitan saves stays inside the run."""
    dump = config.job.dump_folder
    if not dump.strip():
        raise ConfigError("job.dump_folder: empty; give the run's folder, e.g. --job.dump_folder outputs/my_run")
    folders = run_folders(config)
    for field, path in {"job.dump_folder": dump, **folders}.items():
        if why := folder_problem(path, "TOML and TorchTitan do not expand"):
            raise ConfigError(f"{field}: {why}")
        full = os.path.abspath(path)  # it, or its nearest existing ancestor, says whether it can be written
        probe = next(p for p in [full, *map(str, Path(full).parents)] if os.path.exists(p))
        where = f"{field}: {path} " + ("exists but" if probe == full else f"cannot be created: {probe}")
        if not os.path.isdir(probe):
            raise ConfigError(f"{where} is not a directory")
        if not os.access(probe, os.W_OK | os.X_OK):
            raise UnwritableFolderError(f"{where} is not writable; give a folder you can write to")
    for field, path in folders.items():  # "" (an unset shell variable) or ".": step-N, TensorBoard's beside run.json
        if os.path.abspath(path) == os.path.abspath(dump):  # (an analysis's default --tb-dir would be its --out)
            _, default, contents = RUN_PATH_KEYS[field]
            raise ConfigError(
                f"{field}: {attrgetter(field)(config)!r} puts the {contents} in job.dump_folder {dump} itself, "
                f'beside the run\'s other folders; give them a folder of their own, e.g. "{default}"'
            )
    checkpoints = folders.pop("checkpoint.folder", None)
    for field, path in folders.items():
        if checkpoints and inside(path, checkpoints):
            raise ConfigError(  # TorchTitan resumes from an existing checkpoint folder: the start would be skipped
                f"{field}: {path} is inside checkpoint.folder {checkpoints}, which TorchTitan takes for a run to "
                "resume once it exists (a fork's or initial_load_path's start then skipped); give it its own folder"
            )
    saved = config.job.save_config_file
    if saved and not inside(os.path.join(dump, saved), dump):
        raise ConfigError(
            f"job.save_config_file: {saved} lands outside job.dump_folder {dump}; "
            "give a file name inside the run folder (the default job_config.json)"
        )
