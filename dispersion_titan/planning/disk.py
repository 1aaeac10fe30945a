"""The disk a run's checkpoints take when it ends: which steps TorchTitan saves and keeps
(``[checkpoint]``), each a full checkpoint (fp32 weights and AdamW's two fp32 moments) or, the
last one with ``last_save_model_only``, the weights alone (``export_dtype``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

FULL_BYTES_PER_PARAM = 4 + 2 * 4
EXPORT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class CheckpointDisk:
    full: int
    """Full checkpoints kept."""
    model_only: int
    """Weights-only checkpoints kept."""
    bytes: float


def saved_steps(job_config: RunConfig) -> list[int]:
    """The steps a run of ``job_config`` saves and keeps, from scratch to ``training.steps``."""
    c, steps = job_config.checkpoint, job_config.training.steps
    if not c.enable:
        return []
    saved = sorted(({0} if c.save_initial else set()) | set(range(c.interval, steps, c.interval)) | {steps})
    return saved[-c.keep_latest_k :] if c.keep_latest_k > 0 else saved


def checkpoint_disk(job_config: RunConfig, params: float) -> CheckpointDisk:
    """The checkpoints of a run of ``job_config`` whose model has ``params`` parameters."""
    steps = saved_steps(job_config)
    c = job_config.checkpoint
    model_only = int(bool(steps) and c.last_save_model_only)
    full = len(steps) - model_only
    per_param = full * FULL_BYTES_PER_PARAM + model_only * EXPORT_BYTES[c.export_dtype]
    return CheckpointDisk(full, model_only, params * per_param)
