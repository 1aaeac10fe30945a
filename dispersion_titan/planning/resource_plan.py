"""A run's resource plan: layout, measured step, time and checkpoint disk, and the tables ``plan``,
``sweep --plan`` and ``paper --plan`` print (one plan as a table, several as one row each with the
totals). Steps measured alike (sweep cells differing in seed, λ or folder) are measured once per process."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..components.optimizers import MOMENT_BYTES_PER_PARAM
from ..job_config.checks import data_parallel_degree, divisors
from ..job_config.parse import model_args, validated_args
from ..utils.errors import ArgumentError, ConfigError
from .figures import GPU, GPUS, TERM_LABEL, Calibration, calibration, counted
from .step_measure import CATEGORIES, StepMeasurement, measure_step

if TYPE_CHECKING:
    from ..config.schema import RunConfig

GB = 1e9
EAGER_MEMORY = (
    "FSDPMemTracker under FakeTensorMode, eager: a compiled step holds less, GPT-2 small's measured "
    "peak 0.57× its plan (measured on an H200, 2026-11-26)"
)
LATENCY_LABEL = "NCCL's own model of a ring: a prediction"
TIGHT = 0.9  # share of a GPU's memory above which a peak is tight: the CUDA context, fragmentation
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TP_COLLECTIVES_PER_BLOCK = 8
"""Sequence parallel: an all-gather before and a reduce-scatter after attention and the MLP,
forward, and the same in backward."""
RING_BASE_S, RING_HOP_NVLINK_S, RING_HOP_NETWORK_S = 8.4e-6, 3.4e-6, 14.0e-6
"""NCCL's tuning model of a ring (``baseLat``, ``hwLat`` in its ``src/graph/tuning.cc``), not ours."""
DDP_BUCKET_BYTES = 100 * 2**20
"""TorchTitan's ``apply_ddp`` (``bucket_cap_mb=100``, which every family's DDP goes through): gradients are
all-reduced in buckets of 100 MiB, not DDP's default 25."""


@dataclass(frozen=True)
class ResourceLayout:
    gpus: int
    nodes: int
    dp_replicate: int
    dp_shard: int
    tp: int
    micro_batch: int
    """Sequences per GPU per forward (``training.local_batch_size`` as derived for this layout)."""
    accumulation: int
    global_batch: int
    seq_len: int
    n_layers: int
    dim: int
    mlp_width: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def nodes_of(gpus: int, nodes: int | None, gpu: GPU) -> int:
    """``--nodes``, or as few as hold ``gpus`` at ``gpu.gpus_per_node`` each; the GPUs split evenly."""
    count = nodes or math.ceil(gpus / gpu.gpus_per_node)
    if gpus % count:
        split = "does not split" if gpus == 1 else "do not split"
        raise ArgumentError(
            f"--nodes: {counted(gpus, 'GPU')} {split} evenly over {count} nodes; use one of {divisors(gpus)}"
        )
    return count


def resolve_layout(job_config: RunConfig, gpus: int, nodes: int) -> ResourceLayout:
    """The layout ``job_config`` (checked for ``gpus`` processes) takes on ``nodes`` nodes, checked as a
    launch checks it (an impossible one ends in the launch's one line)."""
    p, t = job_config.parallelism, job_config.training
    dp = data_parallel_degree(job_config, gpus)
    replicate = p.data_parallel_replicate_degree
    args: Any = model_args(job_config)
    batch = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * dp
    return ResourceLayout(
        gpus,
        nodes,
        replicate,
        dp // replicate,
        p.tensor_parallel_degree,
        t.local_batch_size,
        batch // (t.local_batch_size * dp),
        batch,
        t.seq_len,
        args.n_layers,
        args.dim,
        args.value_of("mlp_hidden_dim"),
    )


def ring_latency_s(ranks: int, nodes: int, all_reduce: bool = False) -> float:
    """NCCL's model of one ring all-gather or reduce-scatter, or all-reduce (twice the steps)."""
    if ranks <= 1:
        return 0.0
    steps, between = (ranks - 1, nodes - 1) if not all_reduce else (2 * (ranks - 1), 2 * nodes if nodes > 1 else 0)
    return RING_BASE_S + (steps - between) * RING_HOP_NVLINK_S + between * RING_HOP_NETWORK_S


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    data_parallel_s: float
    """The data-parallel collectives, overlapped with the compute (``data_parallel`` names them)."""
    latency_s: float
    """Of ``data_parallel_s``, the collectives' latency."""
    tp_s: float
    calibration: Calibration
    data_parallel: str
    one_gpu_s: float
    """One GPU's step of the same run scaled to this layout's tokens per GPU: the least a step can take."""

    @property
    def step_s(self) -> float:
        return max(max(self.compute_s, self.data_parallel_s) + self.tp_s, self.one_gpu_s)

    @property
    def bounded(self) -> bool:
        """Whether the step is one GPU's per-token time, not this layout's own prediction."""
        return self.one_gpu_s > max(self.compute_s, self.data_parallel_s) + self.tp_s


def step_time(
    job_config: RunConfig,
    layout: ResourceLayout,
    m: StepMeasurement,
    gpu: GPU,
    calibration: Calibration,
    one_gpu_s: float = 0.0,
) -> StepTime:
    """One optimizer step of ``layout`` on ``gpu`` from ``m``; ``one_gpu_s``: its least time (0: none). Its
    calibrated roofline compute plus the dispersion term, the data-parallel collectives overlapped with it,
    tensor parallelism's on the critical path; a collective costs its bytes at its link's bandwidth plus
    NCCL's ring latency."""
    t = job_config.training
    param_bytes, reduce_bytes = DTYPE_BYTES[t.mixed_precision_param], DTYPE_BYTES[t.mixed_precision_reduce]
    roofline = (layout.accumulation * m.micro_batch_s + m.optimizer_s) * calibration.factor
    compute = roofline + layout.accumulation * m.term_s
    per_tp_rank = m.params_total / layout.tp
    units = layout.n_layers + 1  # an FSDP unit per block and the root's (embeddings, norm, head)
    link = gpu.network_bytes_per_s if layout.nodes > 1 else gpu.node_link_bytes_per_s
    r, shard = layout.dp_replicate, layout.dp_shard
    shard_nodes = min(layout.nodes, math.ceil(shard * layout.tp / gpu.gpus_per_node))
    if shard == 1 and r > 1:  # DDP: the gradients all-reduced once a step, in buckets
        times, size, name = 1, per_tp_rank * reduce_bytes, "DDP all-reduce"
        latency = math.ceil(size / DDP_BUCKET_BYTES) * ring_latency_s(r, layout.nodes, all_reduce=True)
        size *= 2 * (r - 1) / r
    else:  # FSDP, each micro-batch: all-gather forward and again in backward, reduce-scatter the gradients
        times, name = layout.accumulation, "HSDP collectives" if r > 1 else "FSDP collectives"
        latency = units * 3 * ring_latency_s(shard, shard_nodes)
        size = (shard - 1) / shard * per_tp_rank * (2 * param_bytes + reduce_bytes)
        if r > 1:  # HSDP: the shards' gradients all-reduced over the replicas
            latency += units * ring_latency_s(r, min(r, layout.nodes), all_reduce=True)
            size += 2 * (r - 1) / r * per_tp_rank / shard * reduce_bytes
    latency *= times  # a step's: DDP's once, FSDP's each micro-batch
    data_parallel = latency + times * size / link
    block_output_bytes = layout.micro_batch * layout.seq_len * layout.dim * param_bytes
    tp_bytes = TP_COLLECTIVES_PER_BLOCK * layout.n_layers * (layout.tp - 1) / layout.tp * block_output_bytes
    tp_link = gpu.node_link_bytes_per_s if layout.tp <= gpu.gpus_per_node else gpu.network_bytes_per_s
    tp_nodes = math.ceil(layout.tp / gpu.gpus_per_node)
    tp_latency = TP_COLLECTIVES_PER_BLOCK * layout.n_layers * ring_latency_s(layout.tp, tp_nodes)
    tp = layout.accumulation * (tp_bytes / tp_link + tp_latency)
    return StepTime(compute, data_parallel, latency, tp, calibration, name, one_gpu_s)


FORWARD_SHARE = 1 / 3
"""A forward's share of a forward and backward (2 of 6 FLOPs a parameter and token)."""
FORWARD_LABEL = "a validation batch priced as a forward, a third of the measured training micro-batch, by tokens"


@dataclass(frozen=True)
class Validation:
    runs: int
    """Validations in the run: at step 1 and every ``validation.freq`` steps, as TorchTitan's ``should_validate``."""
    seconds: float | None
    """All of them on one GPU (None: ``validation.steps = -1``, the whole held-out split, whose size a plan does not
    read)."""


def validation(
    job_config: RunConfig, layout: ResourceLayout, m: StepMeasurement, calibration: Calibration
) -> Validation:
    """The run's validations, each ``validation.steps`` batches of a forward (the roofline's micro-batch by tokens)."""
    v, steps = job_config.validation, job_config.training.steps
    if not v.enable:
        return Validation(0, 0.0)
    runs = steps // v.freq + int(steps >= 1 and v.freq > 1)
    if v.steps < 0:
        return Validation(runs, None)
    tokens = v.steps * v.local_batch_size * v.seq_len / (layout.micro_batch * layout.seq_len)
    return Validation(runs, runs * tokens * FORWARD_SHARE * m.micro_batch_s * calibration.factor)


@dataclass(frozen=True)
class CheckpointDisk:
    full: int
    """Full checkpoints kept."""
    model_only: int
    """Weights-only checkpoints kept."""
    bytes: float


def checkpoint_disk(job_config: RunConfig, params: float, saved: float) -> CheckpointDisk:
    """The checkpoints a run keeps at its end: full ones (fp32 weights, ``saved`` state-dict entries with a tied
    embedding twice, and AdamW's two moments per parameter) and a weights-only last one (``last_save_model_only``).
    A run of 0 steps saves at most its full step 0."""
    c, steps = job_config.checkpoint, job_config.training.steps
    # counted, not listed: a plan of 10**13 steps must not hold a set of its saves
    kept = int(c.save_initial) + len(range(c.interval, steps, c.interval)) + int(steps > 0)
    if not c.enable:
        kept = 0
    elif c.keep_latest_k > 0:
        kept = min(kept, c.keep_latest_k)
    model_only = int(steps > 0 and kept > 0 and c.last_save_model_only)
    full = kept - model_only
    weights = full * 4 + model_only * DTYPE_BYTES[c.export_dtype]
    return CheckpointDisk(full, model_only, saved * weights + params * full * MOMENT_BYTES_PER_PARAM)


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
    validation: Validation

    @property
    def gpu(self) -> GPU:
        return GPUS[self.gpu_key]

    @property
    def memory_share(self) -> float:
        return self.step.peak / (self.gpu.memory_gb * GB)

    @property
    def gpu_hours(self) -> float:
        return (self.time.step_s * self.steps + (self.validation.seconds or 0.0)) * self.layout.gpus / 3600

    @property
    def tokens_per_s(self) -> float:
        return self.layout.tokens_per_step / self.time.step_s


def refuse_if_too_big(plan: ResourcePlan) -> None:
    """A step that does not fit the GPU, in one line naming what does not: the model's own state (its parameters,
    gradients and optimizer state, which no micro-batch changes), else the micro-batch."""
    state = sum(plan.step.memory[name] for name in ("parameters", "gradients", "optimizer"))
    lay, gpu = plan.layout, plan.gpu
    if state > gpu.memory_gb * GB:
        shards = lay.dp_shard * lay.tp
        raise ConfigError(
            f"model: {plan.name}'s {plan.step.params_total:,.0f} parameters (MLP width {lay.mlp_width:,}, dim "
            f"{lay.dim:,}, {counted(lay.n_layers, 'block')}) need {state / GB:,.1f} GB per GPU for their weights, "
            f"gradients and optimizer state alone ({'on one GPU' if shards == 1 else f'sharded over {shards} GPUs'}), "
            f"more than the {gpu.name}'s {gpu.memory_gb:g} GB at any micro-batch; shard them over more GPUs (FSDP) or "
            "use larger ones, or give a smaller MLP width (model.mlp_hidden_dim, a sweep's widths) or model"
        )
    if plan.memory_share > 1:
        raise ConfigError(
            f"training.max_local_batch_size: {plan.name}'s micro-batch of "
            f"{counted(plan.layout.micro_batch, 'sequence')} needs {plan.step.peak / GB:.1f} GB per GPU at its "
            f"peak, more than the {plan.gpu.name}'s {plan.gpu.memory_gb:g} GB; lower it, or set "
            "activation_checkpoint.mode"
        )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _gb(x: float) -> str:
    return f"{x / GB:.2f}"


def plan_table(plan: ResourcePlan) -> str:
    """One run's plan as a Markdown table of its fields."""
    lay, t, checks = plan.layout, plan.time, plan.validation
    replicas = f"{lay.dp_replicate} replicas × " if lay.dp_replicate > 1 else ""
    parts = ", ".join(f"{name} {_gb(plan.step.memory[name])}" for name in CATEGORIES if plan.step.memory[name])
    verdict = "does not fit" if plan.memory_share > 1 else "tight" if plan.memory_share > TIGHT else "fits"
    step = f"**{_ms(t.step_s)}**: compute {_ms(t.compute_s)} ({t.calibration.label})"
    if lay.dp > 1:
        latency = f"{_ms(t.latency_s)} of it latency, {LATENCY_LABEL}"
        step += f"; {t.data_parallel} {_ms(t.data_parallel_s)} (overlapped; {latency})"
    step += f", TP collectives {_ms(t.tp_s)}"
    if t.bounded:
        one_gpu = f"one GPU's {_ms(t.one_gpu_s * lay.gpus)} for as many tokens over {lay.gpus} GPUs"
        step += f"; at least {_ms(t.one_gpu_s)}, {one_gpu} (no layout does a token in fewer GPU-seconds)"
    if plan.dispersion:
        step += f"; {TERM_LABEL}"
    hours = f"**{plan.gpu_hours:,.3g}** for {counted(plan.steps, 'step')} on {lay.gpus} × {plan.gpu.name}"
    validations = counted(checks.runs, "validation")
    if checks.runs and checks.seconds is None:
        hours += f"; validation not included ({validations} of the whole held-out split, validation.steps -1)"
    elif checks.runs:
        hours += f"; validation included: {validations}, {checks.seconds / 3600:,.3g} h a GPU ({FORWARD_LABEL})"
    rows = [
        (
            "layout",
            f"{replicas}DP shard {lay.dp_shard} × TP {lay.tp} on {counted(lay.gpus, 'GPU')} "
            f"({counted(lay.nodes, 'node')}); micro-batch {lay.micro_batch} × {lay.seq_len} tokens, "
            f"{counted(lay.accumulation, 'accumulation step')}; {lay.tokens_per_step:,} tokens per step",
        ),
        ("parameters per rank", f"{plan.step.params_local / 1e6:,.2f} M of {plan.step.params_total / 1e6:,.2f} M"),
        (
            "peak memory per GPU",
            f"**{_gb(plan.step.peak)} GB** of {plan.gpu.memory_gb:g} GB ({plan.memory_share:.0%}, {verdict}): "
            f"{parts} ({EAGER_MEMORY}; {plan.step.depth_note})",
        ),
        ("step time", step),
        ("tokens/s", f"{plan.tokens_per_s:,.0f} ({plan.tokens_per_s / lay.gpus:,.0f} per GPU)"),
        ("GPU-hours", hours),
        (
            "checkpoint disk",
            f"**{_gb(plan.disk.bytes)} GB**: {plan.disk.full:,} full + {plan.disk.model_only:,} weights-only"
            " checkpoints",
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
    unpriced = [p.name for p in plans if p.validation.seconds is None]
    notes += [f"GPU-hours: validation included, {FORWARD_LABEL}"] if any(p.validation.seconds for p in plans) else []
    unpriced_note = f"GPU-hours of {_runs(unpriced, plans)}: validation not included (validation.steps -1)"
    notes += [unpriced_note] if unpriced else []
    bounded = [p.name for p in plans if p.time.bounded]
    notes += [f"step time of {_runs(bounded, plans)}: one GPU's per token (no layout beats it)"] if bounded else []
    return "\n".join(lines + [""] + notes)


def _runs(names: list[str], plans: list[ResourcePlan]) -> str:
    """A note's runs: "every run" where it holds for all of them (a paper table's 13 names once in its row)."""
    return "every run" if len(names) == len(plans) > 1 else ", ".join(names)


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
ONE_GPU = (
    "--parallelism.tensor_parallel_degree",
    "1",
    "--parallelism.data_parallel_shard_degree",
    "-1",
    "--parallelism.data_parallel_replicate_degree",
    "1",
)
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
    block_output_gb = layout.micro_batch * layout.seq_len * layout.dim * 2 / layout.tp / 1e9  # bf16, per TP rank
    if block_output_gb > gpu.memory_gb:  # before the measurement draws a micro-batch of that size from the data
        field, also = (  # one sequence per micro-batch: only a shorter one fits (a RoPE model's seq_len is unbounded)
            ("training.seq_len", "")
            if layout.micro_batch == 1
            else ("training.local_batch_size", " (or training.global_batch_size)")
        )
        raise ConfigError(
            f"{field}: {counted(layout.micro_batch, 'sequence')} of {counted(layout.seq_len, 'token')} per GPU: one "
            f"block's output alone ({block_output_gb:,.0f} GB in bf16) exceeds the memory of an {gpu.name}; lower "
            f"it{also}"
        )
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
        checkpoint_disk(job_config, step.params_total, step.saved_total),
        job_config.training.steps,
        job_config.dispersion.variant != "none",
        validation(job_config, layout, step, calibration(gpu_key)),
    )
