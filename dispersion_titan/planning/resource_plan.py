"""A run's resource plan: layout, measured step, time and checkpoint disk, and the tables ``plan``,
``sweep --plan`` and ``paper --plan`` print (one plan as a table, several as one row each with the
totals). Steps measured alike (sweep cells differing in seed, λ or folder) are measured once per process."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..job_config.parse import validated_args
from ..utils.errors import ConfigError
from .dry_run import dry_run_step as dry_run_step  # plan's, with the plan
from .figures import GPU, GPUS, TERM_LABEL, calibration
from .layout import ResourceLayout, nodes_of, resolve_layout
from .step_measure import CATEGORIES, StepMeasurement, measure_step
from .timing import DTYPE_BYTES, StepTime, step_time

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

GB = 1e9
EAGER_MEMORY = (
    "FSDPMemTracker under FakeTensorMode, eager: a compiled step holds less, GPT-2 small's measured "
    "peak 0.57× its plan (measured on an H200, 2026-11-26)"
)
LATENCY_LABEL = "NCCL's own model of a ring: a prediction"
TIGHT = 0.9  # share of a GPU's memory above which a peak is tight: the CUDA context, fragmentation
FULL_BYTES_PER_PARAM = 4 + 2 * 4


@dataclass(frozen=True)
class CheckpointDisk:
    full: int
    """Full checkpoints kept."""
    model_only: int
    """Weights-only checkpoints kept."""
    bytes: float


def checkpoint_disk(job_config: RunConfig, params: float) -> CheckpointDisk:
    """The checkpoints a run keeps at its end: full ones (fp32 weights and AdamW moments) and a
    weights-only last one (``last_save_model_only``)."""
    c, steps = job_config.checkpoint, job_config.training.steps
    kept = sorted(({0} if c.save_initial else set()) | set(range(c.interval, steps, c.interval)) | {steps})
    if not c.enable:
        kept = []
    elif c.keep_latest_k > 0:
        kept = kept[-c.keep_latest_k :]
    model_only = int(bool(kept) and c.last_save_model_only)
    full = len(kept) - model_only
    per_param = full * FULL_BYTES_PER_PARAM + model_only * DTYPE_BYTES[c.export_dtype]
    return CheckpointDisk(full, model_only, params * per_param)


@dataclass(frozen=True)
class ResourcePlan:
    name: str
    gpu_key: str
    layout: ResourceLayout
    step: StepMeasurement
    time: StepTime
    disk: CheckpointDisk
    steps: int
    dispersion: bool
    """Whether the step has a dispersion term (``TERM_LABEL``)."""

    @property
    def gpu(self) -> GPU:
        return GPUS[self.gpu_key]

    @property
    def memory_share(self) -> float:
        return self.step.peak / (self.gpu.memory_gb * GB)

    @property
    def gpu_hours(self) -> float:
        return self.time.step_s * self.steps * self.layout.gpus / 3600

    @property
    def tokens_per_s(self) -> float:
        return self.layout.tokens_per_step / self.time.step_s

    def fits(self) -> bool:
        return self.memory_share <= 1


def refuse_if_too_big(plan: ResourcePlan) -> None:
    """A step that does not fit the GPU, in one line."""
    if not plan.fits():
        raise ConfigError(
            f"training.max_local_batch_size: {plan.name}'s micro-batch of {plan.layout.micro_batch} sequences needs "
            f"{plan.step.peak / GB:.1f} GB per GPU at its peak, more than the {plan.gpu.name}'s "
            f"{plan.gpu.memory_gb:g} GB; lower it, or set activation_checkpoint.mode"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _gb(x: float) -> str:
    return f"{x / GB:.2f}"


def _memory(plan: ResourcePlan) -> str:
    parts = ", ".join(f"{name} {_gb(plan.step.memory[name])}" for name in CATEGORIES if plan.step.memory[name])
    verdict = "does not fit" if not plan.fits() else "tight" if plan.memory_share > TIGHT else "fits"
    return f"**{_gb(plan.step.peak)} GB** of {plan.gpu.memory_gb:g} GB ({plan.memory_share:.0%}, {verdict}): {parts}"


def _step_time(plan: ResourcePlan) -> str:
    t = plan.time
    gpus = plan.layout.gpus
    bound = (
        f"; at least {_ms(t.one_gpu_s)}, one GPU's {_ms(t.one_gpu_s * gpus)} for as many tokens over {gpus} GPUs "
        "(no layout does a token in fewer GPU-seconds)"
        if t.bounded
        else ""
    )
    data_parallel = (
        f"; {t.data_parallel} {_ms(t.data_parallel_s)} (overlapped; {_ms(t.latency_s)} of it latency, {LATENCY_LABEL})"
        if plan.layout.dp > 1
        else ""
    )
    return (
        f"**{_ms(t.step_s)}**: compute {_ms(t.compute_s)} ({t.calibration.label}){data_parallel}, "
        f"TP collectives {_ms(t.tp_s)}" + bound + (f"; {TERM_LABEL}" if plan.dispersion else "")
    )


def plan_table(plan: ResourcePlan) -> str:
    """One run's plan as a Markdown table of its fields."""
    lay = plan.layout
    rows = [
        ("layout", lay.describe()),
        ("parameters per rank", f"{plan.step.params_local / 1e6:,.2f} M of {plan.step.params_total / 1e6:,.1f} M"),
        ("peak memory per GPU", _memory(plan) + f" ({EAGER_MEMORY}; {plan.step.depth_note})"),
        ("step time", _step_time(plan)),
        ("tokens/s", f"{plan.tokens_per_s:,.0f} ({plan.tokens_per_s / lay.gpus:,.0f} per GPU)"),
        ("GPU-hours", f"**{plan.gpu_hours:,.3g}** for {plan.steps:,} steps on {lay.gpus} × {plan.gpu.name}"),
        (
            "checkpoint disk",
            f"**{_gb(plan.disk.bytes)} GB**: {plan.disk.full} full + {plan.disk.model_only} weights-only checkpoints",
        ),
    ]
    return "\n".join([f"plan: {plan.name}", "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])


RUN_COLUMNS = (
    "run",
    "GPUs",
    "DP × TP",
    "micro-batch × accumulation",
    "params/rank M",
    "peak GB",
    "step ms",
    "tokens/s",
    "GPU-hours",
    "disk GB",
)


def runs_table(plans: list[ResourcePlan]) -> str:
    """Several runs' plans, one row each, then their total GPU-hours and disk."""
    lines = ["| " + " | ".join(RUN_COLUMNS) + " |", "|" + "---|" * len(RUN_COLUMNS)]
    for p in plans:
        lay = p.layout
        lines.append(
            f"| {p.name} | {lay.gpus} × {p.gpu_key.upper()} | {lay.dp} × {lay.tp} | {lay.micro_batch} × "
            f"{lay.accumulation} | {p.step.params_local / 1e6:,.2f} | {_gb(p.step.peak)} "
            f"({p.memory_share:.0%}) | {p.time.step_s * 1e3:.3g} | {p.tokens_per_s:,.0f} | "
            f"{p.gpu_hours:,.3g} | {_gb(p.disk.bytes)} |"
        )
    hours, disk = sum(p.gpu_hours for p in plans), sum(p.disk.bytes for p in plans)
    lines.append(f"| **total ({len(plans)} runs)** | | | | | | | | **{hours:,.3g}** | **{_gb(disk)}** |")
    labels = sorted({p.time.calibration.label for p in plans})
    notes = [f"step time: {label}" for label in labels] + sorted({f"memory: {p.step.depth_note}" for p in plans})
    notes += [f"step time of the runs with a term: {TERM_LABEL}"] if any(p.dispersion for p in plans) else []
    notes += [f"collectives' latency: {LATENCY_LABEL}"]
    bounded = [p.name for p in plans if p.time.bounded]
    notes += [f"step time of {', '.join(bounded)}: one GPU's per token (no layout beats it)"] if bounded else []
    return "\n".join(lines + [""] + notes)


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
    values = asdict(job_config)
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
    job_config = validated_args(args, gpus)
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
