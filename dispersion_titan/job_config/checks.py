"""Checks run on the parsed job config before any process group starts.

Each failure is a ``ConfigError`` (``dispersion_titan.utils.errors``) whose one-line message names the offending field,
so ``dispersion_titan.train`` can print it and exit non-zero without touching the
dump folder.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import importlib.util
import math
import os
import typing
from typing import TYPE_CHECKING, Any

from ..components.titan_compat import model_converter_names
from ..data.corpora import check_dataset
from ..data.store import is_store, open_store
from ..losses.options import (
    CONFIG_RANGES,
    precision_error,
    range_error,
    resolve_layers,
)
from ..models.flavors import DROPOUT_KEYS, SHAPE_KEYS
from ..run_folder.owners import inside
from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, hf_tokenizer, tokenizer_folder
from ..tokenizer.hf_assets import is_hub_id
from ..utils.errors import ConfigError, DataConfigError
from . import released

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

# torch 2.11 (the lent GPU nodes') trains GPT-2 under tensor parallel with LayerNorm updates 7-10% off
# one process's (tests/test_parallel_equivalence.py, docs/cluster.md#offline-nodes); 2.13 agrees.
GPT2_TP_TORCH = (2, 13)


def torch_release() -> tuple[int, int]:
    """The installed torch's (major, minor), read from its metadata (torch itself not imported)."""
    major, minor = importlib.metadata.version("torch").split(".")[:2]
    return int(major), int(minor)


SPLIT_OF = {"training": "train", "validation": "validation"}


# Float settings for which infinity has a meaning: no clipping.
INFINITY_MEANS = {"training.max_norm": "no gradient clipping"}


def check_finite(config: RunConfig) -> None:
    """Every float setting, ours and TorchTitan's, is a finite number (``inf`` only where
    ``INFINITY_MEANS`` gives it a meaning): ``--dispersion.coeff inf`` would train on an
    infinite loss, ``--optimizer.lr nan`` on NaN weights."""
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        if not dataclasses.is_dataclass(values):
            continue
        hints = typing.get_type_hints(type(values))
        for field in dataclasses.fields(values):
            value, key = getattr(values, field.name), f"{section.name}.{field.name}"
            hint = hints.get(field.name)
            if not (hint is float or float in typing.get_args(hint)) or not isinstance(value, float):
                continue
            if math.isnan(value) or (math.isinf(value) and key not in INFINITY_MEANS):
                raise ConfigError(f"{key}: must be a finite number, got {value}")


def check_dispersion(config: RunConfig, n_layers: int) -> None:
    d = config.dispersion
    for name in CONFIG_RANGES:
        problem = range_error(name, getattr(d, name), CONFIG_RANGES)
        if problem:
            raise ConfigError(f"dispersion.{name}: {problem}")
    problem = precision_error(d.variant, d.precision)
    if problem:
        raise ConfigError(f"dispersion.precision: {problem}")
    if d.kernel == "triton" and d.variant != "none" and not _triton_device_here():
        raise ConfigError(
            "dispersion.kernel: 'triton' needs a CUDA GPU, and torch sees none here; "
            "use 'auto' (the PyTorch strips on CPU) or 'torch'"
        )
    try:
        resolve_layers(d.layers, n_layers)
    except ValueError as e:
        raise ConfigError(f"dispersion.layers: {e}") from None
    # Every layout hands each rank whole sequences for the term (TP ranks exchange them:
    # trainer/sequence_parallel.py), so a rank's sequences hold seq_len tokens each.
    if d.variant != "none" and config.training.seq_len < 2:
        raise ConfigError(
            f"training.seq_len: {config.training.seq_len} token per sequence leaves no pair of tokens "
            f"for the {d.variant} term (as dispersion.max_tokens, it needs >= 2); use a longer "
            'sequence, or dispersion.variant = "none"'
        )


CPU_PROFILE_HINT = "run CPU jobs with --profile cpu (compile off, foreach AdamW: the same computation)"


def check_runs_here(config: RunConfig) -> None:
    """A GPU config on a machine whose torch sees no GPU is refused in one line naming the CPU
    profile, never changed silently. Only inductor is refused: it compiles for GPUs, and on a
    CPU it needs a C++ toolchain and minutes per start; fused AdamW runs on CPUs too."""
    import torch

    c = config.compile
    if c.enable and c.backend == "inductor" and not torch.cuda.is_available():
        raise ConfigError(
            f"compile.enable: true compiles with inductor for GPUs and torch sees none here; {CPU_PROFILE_HINT}"
        )
    if config.training.head_loss == "liger" and not _triton_device_here():
        raise ConfigError('training.head_loss: "liger" runs Triton kernels, and torch sees no GPU here; use "torch"')


def _triton_device_here() -> bool:
    """Whether the Triton kernels can run in this job: a CUDA device, or Triton's CPU interpreter."""
    import torch

    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def run_tokenizer(config: RunConfig) -> DocumentEncoder | None:
    """The run's tokenizer (``encoders.tokenizer_folder``); None while ``model.hf_assets_path``
    is a hub id not fetched yet (``train`` fetches it before these checks run for real)."""
    folder = tokenizer_folder(config.model.name, config.model.hf_assets_path)
    if folder is None:
        return GPT2_BPE
    if os.path.isdir(os.path.expanduser(folder)):
        return hf_tokenizer(os.path.expanduser(folder))
    if is_hub_id(folder):
        return None
    raise ConfigError(
        f"model.hf_assets_path: {folder}: no such folder; give the {config.model.name} model's "
        'Hugging Face folder or hub id (its tokenizer.json), or "" for GPT-2\'s BPE'
    )


def check_model(config: RunConfig, args: Any) -> None:
    """``args``: the flavor's arguments with the ``[model]`` overrides applied."""
    name = config.model.name
    head_loss = config.training.head_loss
    if head_loss != "torch" and (name != "gpt2" or config.parallelism.tensor_parallel_degree > 1):
        raise ConfigError(f'training.head_loss: "{head_loss}" takes gpt2 without tensor parallelism; use "torch"')
    if config.compile.whole_model and name != "gpt2":
        raise ConfigError("compile.whole_model: gpt2 only (TorchTitan compiles the other families per block)")
    for key in SHAPE_KEYS:
        value = getattr(config.model, key)
        if value is not None and value < 0:
            raise ConfigError(f"model.{key}: must be positive, got {value}")
    for key in DROPOUT_KEYS:
        value = getattr(args, key, 0.0)
        if not 0 <= value < 1:
            raise ConfigError(f"model.{key}: must be in [0, 1), got {value}")
        if (
            value
            and config.activation_checkpoint.mode != "none"
            and not config.activation_checkpoint.preserve_rng_state
        ):
            raise ConfigError(
                f"activation_checkpoint.preserve_rng_state: model.{key} = {value} needs it true "
                "(the recomputation must draw the same dropout masks)"
            )
    if "head_dim" not in args.OVERRIDES and args.dim % args.n_heads:  # heads of width dim / n_heads
        raise ConfigError(f"model.dim: {args.dim} is not divisible by model.n_heads={args.n_heads}")
    tp = config.parallelism.tensor_parallel_degree
    if tp < 1:
        raise ConfigError(f"parallelism.tensor_parallel_degree: must be >= 1, got {tp}")
    if tp > 1 and config.model.name == "gpt2" and torch_release() < GPT2_TP_TORCH:
        need, have = (".".join(map(str, v)) for v in (GPT2_TP_TORCH, torch_release()))
        raise ConfigError(
            f"parallelism.tensor_parallel_degree: GPT-2's tensor parallel needs torch {need} or later, this is "
            f"{have} (its norms' updates drift from one process's); use data parallelism or a newer torch"
        )
    kv_heads = getattr(args, "n_kv_heads", None) or args.n_heads
    for key, value in (("n_heads", args.n_heads), ("n_kv_heads", kv_heads), ("mlp_hidden_dim", args.hidden_dim)):
        if value % tp:
            raise ConfigError(f"model.{key}: {value} is not divisible by parallelism.tensor_parallel_degree={tp}")
    if args.positions is not None and args.positions % tp:
        raise ConfigError(
            f"model.max_seq_len: {args.positions} positions are not divisible by "
            f"parallelism.tensor_parallel_degree={tp}"
        )
    sections = ("training", "validation") if config.validation.enable else ("training",)
    for section in sections:
        seq_len = getattr(config, section).seq_len
        if not 0 < seq_len <= (args.positions or seq_len):
            raise ConfigError(
                f"{section}.seq_len: {seq_len} must be in 1..{args.positions} (model.max_seq_len positions)"
            )
        if seq_len % tp:
            raise ConfigError(
                f"{section}.seq_len: {seq_len} is not divisible by parallelism.tensor_parallel_degree={tp}"
            )
    tokenizer = run_tokenizer(config)
    if tokenizer is not None and args.vocab_size < tokenizer.vocab_size:
        which = "GPT-2" if tokenizer is GPT2_BPE else config.model.hf_assets_path
        raise ConfigError(
            f"model.vocab_size: {args.vocab_size} is smaller than the {which} tokenizer's {tokenizer.vocab_size} ids"
        )
    if config.parallelism.pipeline_parallel_degree != 1:
        raise ConfigError(
            f"parallelism.pipeline_parallel_degree: dispersion_titan's {name} does not support pipelining"
        )
    if config.parallelism.context_parallel_degree != 1:
        raise ConfigError(
            f"parallelism.context_parallel_degree: dispersion_titan's {name} does not support context parallel"
        )


def check_data(config: RunConfig) -> None:
    for section in ("training", "validation"):
        if section == "validation" and not config.validation.enable:
            continue
        cfg = getattr(config, section)
        try:
            tokenizer = run_tokenizer(config)
            if is_store(cfg.dataset_path):  # a stale or damaged token store fails here, before any rank starts
                if tokenizer is not None:
                    open_store(cfg.dataset_path, cfg.dataset, SPLIT_OF[section], f"{section}.dataset_path", tokenizer)
            else:
                check_dataset(cfg.dataset, cfg.dataset_path, f"{section}.dataset")  # never contacts the hub
        except DataConfigError as e:
            raise ConfigError(str(e)) from None
    for section in ("training", "validation"):
        size = getattr(config, section).local_batch_size
        if size < 0:
            raise ConfigError(f"{section}.local_batch_size: must be >= 0 (0 derives it), got {size}")
    if config.training.dataloader.num_workers != 0:
        raise ConfigError("training.dataloader.num_workers: must be 0 (the packed stream is stateful)")


def check_checkpoint(config: RunConfig, world_size: int) -> None:
    ckpt = config.checkpoint
    if ckpt.create_seed_checkpoint and (world_size != 1 or not ckpt.enable):
        raise ConfigError(
            "checkpoint.create_seed_checkpoint: needs one process (NPROC=1) and checkpoint.enable, "
            f"got {world_size} processes and enable = {ckpt.enable}"
        )
    if ckpt.enable and ckpt.interval < 1:
        raise ConfigError(f"checkpoint.interval: must be >= 1, got {ckpt.interval}")
    if ckpt.save_initial and ckpt.keep_latest_k > 0:
        raise ConfigError(
            "checkpoint.keep_latest_k: must be 0 with checkpoint.save_initial, "
            "or TorchTitan deletes the step-0 checkpoint"
        )


def check_initial_load(config: RunConfig) -> None:
    """What TorchTitan's checkpointer loads before a new run's first step (``checkpoint.initial_load_*``),
    looked at as it will look: it asserts or raises mid-launch, in a traceback, otherwise. At launch only
    (``parse.check_launch``; a plan needs no weights). A relaunch (its checkpoint folder exists) loads its
    own checkpoints instead; a hub id is looked at once fetched."""
    c = config.checkpoint
    if not c.enable or os.path.exists(os.path.join(config.job.dump_folder, c.folder)):
        return
    if c.initial_load_in_hf_quantized and not c.initial_load_in_hf:
        raise ConfigError("checkpoint.initial_load_in_hf_quantized: needs checkpoint.initial_load_in_hf = true")
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
        return
    problem = "no such folder" if not os.path.isdir(path) else f"no {'*.safetensors' if hf else '.metadata'} in it"
    if key == "checkpoint.initial_load_in_hf":
        raise ConfigError(
            f"checkpoint.initial_load_in_hf: true loads Hugging Face weights from model.hf_assets_path {path} "
            f"when checkpoint.initial_load_path is empty ({problem}); give initial_load_path the model's folder, "
            "or set initial_load_in_hf = false to train from scratch"
        )
    what = "a Hugging Face model's folder (its *.safetensors)" if hf else "a checkpoint's step-N folder"
    raise ConfigError(f'{key}: {path}: {problem}; give {what}, or "" to train from scratch')


def check_titan_settings(config: RunConfig) -> None:
    """Values TorchTitan 0.2.2 (or torch's AdamW) asserts or raises on only once the job runs, some after
    training (``last_save_in_hf``): each refused here in one line naming the key."""
    c = config.checkpoint
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
    positive = {
        "metrics.log_freq": config.metrics.log_freq,
        "training.gc_freq": config.training.gc_freq,
        "comm.init_timeout_seconds": config.comm.init_timeout_seconds,
        "comm.train_timeout_seconds": config.comm.train_timeout_seconds,
        **({"validation.freq": config.validation.freq} if config.validation.enable else {}),
        "lr_scheduler.total_steps": 1 if config.lr_scheduler.total_steps is None else config.lr_scheduler.total_steps,
    }
    for key, value in positive.items():
        if value < 1:
            raise ConfigError(f"{key}: must be >= 1, got {value}")
    if config.training.steps < 0:
        raise ConfigError(f"training.steps: must be >= 0, got {config.training.steps}")
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
    o = config.optimizer
    if o.name not in ("Adam", "AdamW"):
        raise ConfigError(f"optimizer.name: {o.name!r} is not one of TorchTitan's ('Adam', 'AdamW')")
    for key in ("lr", "eps", "weight_decay"):
        if getattr(o, key) < 0:
            raise ConfigError(f"optimizer.{key}: must be >= 0, got {getattr(o, key)}")
    for key in ("beta1", "beta2"):
        if not 0 <= getattr(o, key) < 1:
            raise ConfigError(f"optimizer.{key}: must be in [0, 1), got {getattr(o, key)}")
    unknown = [name for name in config.model.converters if name not in model_converter_names()]
    if unknown:
        raise ConfigError(
            f"model.converters: {unknown[0]!r} is not one of TorchTitan 0.2.2's {sorted(model_converter_names())}"
        )


def resolve_replicate_degree(config: RunConfig, world_size: int) -> None:
    """``data_parallel_replicate_degree = -1``: every data-parallel process holds the whole model
    (DDP, the authors' layout), resolved to a count here, as TorchTitan takes only counts. Replicated
    without sharding, TorchTitan computes under autocast, which it turns off beside tensor, context or
    pipeline parallelism: that combination is refused."""
    p = config.parallelism
    others = p.tensor_parallel_degree * p.context_parallel_degree * p.pipeline_parallel_degree
    if p.data_parallel_replicate_degree == -1:
        if p.data_parallel_shard_degree != 1:
            raise ConfigError(
                f"parallelism.data_parallel_replicate_degree: -1 (replicate over every process) "
                f"needs data_parallel_shard_degree = 1, not {p.data_parallel_shard_degree}"
            )
        if world_size % others:
            raise ConfigError(
                f"parallelism: {world_size} processes are not divisible by "
                f"tensor × context × pipeline parallel degrees = {others}"
            )
        p.data_parallel_replicate_degree = world_size // others
    elif p.data_parallel_replicate_degree < 1:
        raise ConfigError(
            f"parallelism.data_parallel_replicate_degree: {p.data_parallel_replicate_degree}; "
            "use a count >= 1, or -1 for every process"
        )
    if p.data_parallel_replicate_degree > 1 and p.data_parallel_shard_degree == 1 and others > 1:
        raise ConfigError(
            "parallelism.data_parallel_replicate_degree: replicated parameters (DDP) with tensor, "
            "context or pipeline parallelism train without mixed precision in TorchTitan 0.2.2; "
            "shard instead (data_parallel_shard_degree = -1)"
        )


def data_parallel_degree(config: RunConfig, world_size: int) -> int:
    """The DP degree TorchTitan's ParallelDims will build from ``world_size`` processes."""
    p = config.parallelism
    others = p.tensor_parallel_degree * p.context_parallel_degree * p.pipeline_parallel_degree
    if p.data_parallel_shard_degree == -1 or p.data_parallel_replicate_degree == -1:
        if world_size % others:
            raise ConfigError(
                f"parallelism: {world_size} processes are not divisible by "
                f"tensor × context × pipeline parallel degrees = {others}"
            )
        return world_size // others
    dp = p.data_parallel_replicate_degree * p.data_parallel_shard_degree
    if dp * others != world_size:
        raise ConfigError(
            f"parallelism: data_parallel_replicate_degree × data_parallel_shard_degree × "
            f"tensor × context × pipeline = {dp * others}, but there are {world_size} processes"
        )
    return dp


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_batch_sizes(config: RunConfig, dp: int) -> None:
    """Check the batch sizes against ``dp`` data-parallel ranks and fill in derived ones
    (``local_batch_size = 0``), before TorchTitan asserts them once NCCL runs.

    Training: each rank's share global/dp is split into micro-batches of the largest
    divisor of it up to ``max_local_batch_size``; accumulation does the rest. Validation
    has no accumulation: its per-rank batch is its global batch / dp.
    """
    t = config.training
    if t.max_local_batch_size < 0:
        raise ConfigError(f"training.max_local_batch_size: must be >= 0, got {t.max_local_batch_size}")
    if t.global_batch_size > 0:
        size = t.global_batch_size
    elif t.local_batch_size > 0:
        size = t.local_batch_size * dp
    else:
        raise ConfigError("training.local_batch_size: 0 (derive it) needs a training.global_batch_size > 0")
    if size % dp:
        raise ConfigError(
            f"training.global_batch_size: {size} sequences cannot be split over {dp} "
            f"data-parallel ranks; use a multiple of {dp}"
        )
    share = size // dp
    if t.local_batch_size == 0:
        t.local_batch_size = max(d for d in _divisors(share) if d <= (t.max_local_batch_size or share))
    elif share % t.local_batch_size:
        raise ConfigError(
            f"training.local_batch_size: {t.local_batch_size} does not divide the {share} sequences per rank "
            f"(global_batch_size {size} over {dp} data-parallel ranks); use one of {_divisors(share)}, "
            "or 0 to derive it"
        )
    v = config.validation
    if not v.enable:
        return
    size = v.global_batch_size if v.global_batch_size > 0 else size
    if size % dp:
        raise ConfigError(
            f"validation.global_batch_size: {size} sequences cannot be split over {dp} "
            f"data-parallel ranks; use a multiple of {dp}"
        )
    if v.local_batch_size == 0:
        v.local_batch_size = size // dp
    elif v.local_batch_size * dp != size:
        raise ConfigError(
            f"validation.local_batch_size: {v.local_batch_size} × {dp} data-parallel ranks is not the "
            f"validation global batch of {size} sequences; use {size // dp}, or 0 to derive it"
        )


def _unwritable(path: str) -> str | None:
    """Why a folder could not be created or written at ``path`` (None: it can), without
    creating anything: the nearest existing ancestor decides."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None


def run_folders(config: RunConfig) -> dict[str, str]:
    """Every folder TorchTitan writes for this run, by config key (``owners.RUN_PATH_KEYS``), as
    it resolves them: joined to ``job.dump_folder`` (an absolute one stays as it is)."""
    written = {
        "checkpoint.folder": config.checkpoint.enable,
        "metrics.save_tb_folder": config.metrics.enable_tensorboard or config.metrics.enable_wandb,
        "comm.save_traces_folder": config.comm.trace_buf_size > 0,
        "profiling.save_traces_folder": config.profiling.enable_profiling,
        "profiling.save_memory_snapshot_folder": config.profiling.enable_memory_snapshot,
    }
    return {key: os.path.join(config.job.dump_folder, _value(config, key)) for key, on in written.items() if on}


def _value(config: RunConfig, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(config, section), name)


def check_output_folders(config: RunConfig) -> None:
    """Every folder the run writes to, checked before any process group starts; the config file
    TorchTitan saves stays inside the run (it could replace another run's ``run.json``)."""
    dump = config.job.dump_folder
    folders = {"job.dump_folder": dump, **run_folders(config)}
    for field, path in folders.items():
        problem = _unwritable(path)
        if problem:
            raise ConfigError(f"{field}: {path} cannot be created: {problem}")
    saved = config.job.save_config_file
    if saved and not inside(os.path.join(dump, saved), dump):
        raise ConfigError(
            f"job.save_config_file: {saved} lands outside job.dump_folder {dump}; "
            "give a file name inside the run folder (the default job_config.json)"
        )


def check_metrics(config: RunConfig) -> None:
    if config.metrics.enable_wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError(
            "metrics.enable_wandb: the wandb package is not installed; "
            "pip install 'dispersion_titan[wandb]', or set it false"
        )


def check_baseline(config: RunConfig) -> None:
    b = config.baseline
    if not (math.isfinite(b.noise_alpha) and b.noise_alpha >= 0):
        raise ConfigError(f"baseline.noise_alpha: must be a finite number >= 0, got {b.noise_alpha}")
    if b.forget_every < 1:
        raise ConfigError(f"baseline.forget_every: must be >= 1, got {b.forget_every}")
    if not (math.isfinite(b.embedding_lr) and b.embedding_lr > 0):
        raise ConfigError(f"baseline.embedding_lr: must be a finite number > 0, got {b.embedding_lr}")
    if b.method == "active_forgetting":
        # Both replace the per-model-part optimizer in which the embeddings get their own group.
        if config.optimizer.early_step_in_backward:
            raise ConfigError(
                "optimizer.early_step_in_backward: not supported with baseline.method = active_forgetting"
            )
        if config.fault_tolerance.enable:
            raise ConfigError("fault_tolerance.enable: not supported with baseline.method = active_forgetting")
        if b.forget_every >= config.training.steps and not released.is_on(config):  # theirs: a note
            raise ConfigError(
                f"baseline.forget_every: {b.forget_every} >= training.steps ({config.training.steps}): "
                "no reset would ever happen; make it smaller or use baseline.method = none"
            )


def check_optimizer(config: RunConfig) -> None:
    o = config.optimizer
    if o.decay_groups != "all" and o.early_step_in_backward:  # one optimizer per parameter: no groups to split
        raise ConfigError(
            f"optimizer.early_step_in_backward: not supported with optimizer.decay_groups = {o.decay_groups!r}"
        )
    lr = config.lr_scheduler
    if lr.form == "as_released" and (lr.decay_type != "cosine" or lr.decay_ratio is not None):
        raise ConfigError(
            f"lr_scheduler.form: 'as_released' is transformers' cosine schedule, decaying over every "
            f"step after the warm-up; set decay_type = 'cosine' (not {lr.decay_type!r}) and leave "
            "decay_ratio unset"
        )


def carry_baseline(config: RunConfig) -> None:
    """The ``[baseline]`` section also where the optimizer and LR-scheduler builders look
    (``config.schema.BuilderInputs``)."""
    config.optimizer.baseline = config.lr_scheduler.baseline = config.baseline


def launch_notes(config: RunConfig) -> list[str]:
    """Settings that are valid but probably not meant, said once at launch: a variant with
    ``coeff`` left at 0 computes its term and trains on cross-entropy alone."""
    notes = [released.summary(config)] if released.is_on(config) else []
    d, b = config.dispersion, config.baseline
    if d.variant != "none" and d.coeff == 0:
        notes.append(
            f"dispersion.coeff is 0: the {d.variant} term is logged but adds nothing to the loss; "
            'set dispersion.coeff > 0, or dispersion.variant = "none"'
        )
    if b.method == "active_forgetting" and b.forget_every >= config.training.steps:
        notes.append(
            f"baseline.forget_every: {b.forget_every} >= the {config.training.steps} steps of [released]'s layout: "
            "no reset happens, as in the authors' script at this GPU count (their K is fixed)"
        )
    return notes


def check_job_config(config: RunConfig, args: Any, world_size: int = 1) -> None:
    """Everything about ``config`` that can be known before any process starts, for a
    job of ``world_size`` processes; derived values (batch sizes, the builders' baseline)
    are filled in, for the trainer to read. ``args``: the model family's flavor with the
    ``[model]`` overrides applied."""
    check_finite(config)
    check_model(config, args)
    check_dispersion(config, args.n_layers)
    resolve_replicate_degree(config, world_size)
    released.resolve(config, data_parallel_degree(config, world_size))  # before what reads the steps
    check_baseline(config)
    check_optimizer(config)
    carry_baseline(config)
    check_data(config)
    check_checkpoint(config, world_size)
    check_titan_settings(config)
    resolve_batch_sizes(config, data_parallel_degree(config, world_size))
    check_output_folders(config)
    check_metrics(config)
