"""One run's resource plan: layout, measured step, time and disk; the one module ``plan`` imports.
Steps measured alike (sweep cells differing in seed, λ or folder) are measured once per process."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from ..utils.errors import ConfigError
from .dry_run import dry_run_step
from .figures import GPUS, calibration
from .layout import checked_config, nodes_of, resolve_layout
from .report import ResourcePlan, checkpoint_disk, plan_table, refuse_if_too_big, runs_table
from .step_measure import StepMeasurement, measure_step
from .timing import step_time

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

__all__ = ["checked_config", "dry_run_step", "plan_table", "planned", "refuse_if_too_big", "runs_table"]
NOT_MEASURED = {
    "job": None,
    "checkpoint": None,
    "metrics": None,
    "validation": None,
    "lr_scheduler": None,
    "debug": ("seed",),
    "training": ("steps", "dataset", "dataset_path"),
    "dispersion": ("coeff", "warmup_steps"),
}
"""Settings that change neither a step's memory nor its operators (None: the whole section)."""
_measured: dict[str, StepMeasurement] = {}
ONE_GPU = ("--parallelism.tensor_parallel_degree", "1", "--parallelism.data_parallel_shard_degree", "-1")
"""A run's overrides as one GPU trains it."""


def _measurement_key(job_config: RunConfig, world: int, gpu: str) -> str:
    values = dataclasses.asdict(job_config)
    for section, keys in NOT_MEASURED.items():
        if keys is None:
            values.pop(section, None)
        else:
            for key in keys:
                values.get(section, {}).pop(key, None)
    return json.dumps([values, world, gpu], sort_keys=True, default=str)


def planned(name: str, args: list[str], gpus: int, nodes: int | None, gpu_key: str) -> ResourcePlan:
    """The plan of a launch's ``args`` on ``gpus`` × ``gpu_key``; on several GPUs a step takes at
    least one GPU's per-token time."""
    gpu = GPUS[gpu_key]
    job_config = checked_config(args, gpus)
    layout = resolve_layout(job_config, gpus, nodes_of(gpus, nodes, gpu))
    key = _measurement_key(job_config, gpus, gpu_key)
    if key not in _measured:
        _measured[key] = measure_step(job_config, gpus, gpu, layout.n_layers)
    step = _measured[key]
    least = 0.0
    if gpus > 1:
        try:
            one = planned(name, [*args, *ONE_GPU], 1, None, gpu_key)
            least = one.time.step_s * layout.tokens_per_step / one.layout.tokens_per_step / gpus
        except ConfigError:  # a run one GPU cannot lay out (its batch): no bound
            pass
    return ResourcePlan(
        name,
        gpu_key,
        layout,
        step,
        step_time(job_config, layout, step, gpu, calibration(gpu_key), least),
        checkpoint_disk(job_config, step.params_total),
        job_config.training.steps,
        job_config.dispersion.variant != "none",
    )
