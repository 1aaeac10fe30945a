"""``[released]``: a paper config's layout for N GPUs, as the authors' scripts compute it (see
``config.schema.Released``). The keys it derives, set by hand, are refused, so no launch trains a
layout their script never ran by accident.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..components.optimizers import body_warmup_steps
from ..config.cli import given_keys
from ..utils.errors import ConfigError, docs_page

if TYPE_CHECKING:
    from ..config.schema import RunConfig

LAYOUT_KEYS = (
    "training.global_batch_size",
    "training.local_batch_size",
    "training.steps",
    "optimizer.lr",
    "lr_scheduler.warmup_steps",
    "checkpoint.interval",
    "validation.freq",
)
"""The keys ``[released]`` sets for the run's GPU count."""
REQUIRED = ("gradient_accumulation_steps", "train_tokens", "num_ckpt")
"""``[released]`` keys that must be positive once ``per_device_train_batch_size`` is."""


def is_on(config: RunConfig) -> bool:
    return config.released.per_device_train_batch_size > 0


def refuse_derived_keys(config: RunConfig, args: list[str], toml: dict) -> None:
    if not is_on(config):
        return
    for key in LAYOUT_KEYS:
        if key in given_keys(args, toml):
            raise ConfigError(
                f"{key}: set from [released] for the run's GPU count, as the authors' script does "
                f"({docs_page('reproduction.md', 'A paper config on N GPUs')}); remove it, change [released]'s keys "
                "(fewer steps: --released.train_tokens), or set released.per_device_train_batch_size = 0 "
                "and give the whole layout yourself"
            )


def resolve(config: RunConfig, dp: int) -> None:
    """Fill in ``LAYOUT_KEYS`` for ``dp`` ranks replicating the model (the authors' DDP; others refused)."""
    r, p = config.released, config.parallelism
    if not is_on(config):
        return
    for key in REQUIRED:
        if getattr(r, key) < 1:
            raise ConfigError(
                f"released.{key}: must be >= 1 with released.per_device_train_batch_size, got {getattr(r, key)}"
            )
    if not (r.lr > 0 and 0 <= r.warmup_ratio <= 1):
        raise ConfigError(
            f"released.lr, released.warmup_ratio: need lr > 0 and a ratio in [0, 1], got {r.lr}, {r.warmup_ratio}"
        )
    if p.data_parallel_replicate_degree != dp or p.tensor_parallel_degree > 1:  # context: check_model
        raise ConfigError(
            "parallelism: the authors' script replicates the whole model on every GPU (DDP); set "
            "data_parallel_replicate_degree = -1 and leave the shard, tensor, context and pipeline degrees at 1"
        )
    gpus = r.gpus or dp
    per_gpu = r.per_device_train_batch_size * r.gradient_accumulation_steps
    t = config.training
    if gpus * per_gpu % dp:
        raise ConfigError(
            f"released.gpus: the authors' {gpus}-GPU step of {gpus * per_gpu} sequences cannot be split over "
            f"{dp} ranks; launch {gpus} (or a divisor of {gpus * per_gpu}), or set released.gpus = {dp}"
        )
    t.global_batch_size = gpus * per_gpu
    t.local_batch_size = 0
    t.max_local_batch_size = min(t.max_local_batch_size or r.per_device_train_batch_size, r.per_device_train_batch_size)
    t.steps = math.ceil(r.train_tokens / (t.global_batch_size * t.seq_len))
    config.optimizer.lr = r.lr * math.sqrt(gpus)
    config.lr_scheduler.warmup_steps = math.ceil(r.warmup_ratio * t.steps)
    config.checkpoint.interval = config.validation.freq = t.steps // r.num_ckpt + 1


def summary(config: RunConfig) -> str:
    """The derived layout, said once at launch."""
    r, t, schedule = config.released, config.training, config.lr_scheduler
    gpus = t.global_batch_size // (r.per_device_train_batch_size * r.gradient_accumulation_steps)
    forgetting = config.baseline.method == "active_forgetting" and schedule.form == "as_released"
    warmup = body_warmup_steps(schedule.warmup_steps, schedule.total_steps or t.steps, forgetting)
    scaled = (
        f"; loss scaled by their accumulation {r.gradient_accumulation_steps}" if t.loss_scale == "as_released" else ""
    )
    return (
        f"[released] on {gpus} GPU{'s' * (gpus > 1)}: {r.per_device_train_batch_size} × "
        f"{r.gradient_accumulation_steps} sequences per GPU, global batch {t.global_batch_size}, {t.steps} steps "
        f"({r.train_tokens:,} tokens), lr {config.optimizer.lr:.4g}, warm-up {warmup}, "
        f"checkpoints every {config.checkpoint.interval}{scaled}"
    )
