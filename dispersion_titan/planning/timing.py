"""A step's time on the planned GPUs: the roofline of its compute (``planning.roofline``, scaled by
the calibration of ``planning.figures``) plus its dispersion term (``figures.term_seconds``), FSDP's
collectives overlapped with it (TorchTitan prefetches the next block's all-gather), tensor
parallelism's on the critical path. The collectives' bytes follow from the layout, each sent at its
link's bandwidth: NVLink inside a node, InfiniBand between nodes. A prediction, never a measurement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .figures import Calibration
from .gpus import GPU
from .layout import ResourceLayout
from .measurement import StepMeasurement

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TP_COLLECTIVES_PER_BLOCK = 8
"""Sequence parallel: an all-gather before and a reduce-scatter after attention and the MLP,
forward, and the same in backward."""


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    fsdp_s: float
    tp_s: float
    calibration: Calibration

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.fsdp_s) + self.tp_s


def step_time(
    job_config: RunConfig, layout: ResourceLayout, m: StepMeasurement, gpu: GPU, calibration: Calibration
) -> StepTime:
    """One optimizer step of ``layout`` on ``gpu``, from ``m`` (one micro-batch and the optimizer)."""
    t = job_config.training
    param_bytes, reduce_bytes = DTYPE_BYTES[t.mixed_precision_param], DTYPE_BYTES[t.mixed_precision_reduce]
    roofline = (layout.accumulation * m.micro_batch_s + m.optimizer_s) * calibration.factor
    compute = roofline + layout.accumulation * m.term_s
    per_tp_rank = m.params_total / layout.tp
    fsdp_bytes = 0.0
    if layout.dp_shard > 1:  # all-gather forward and again in backward, reduce-scatter the gradients
        fsdp_bytes += (layout.dp_shard - 1) / layout.dp_shard * per_tp_rank * (2 * param_bytes + reduce_bytes)
    if layout.dp_replicate > 1:  # HSDP: the shards' gradients all-reduced over the replicas
        r = layout.dp_replicate
        fsdp_bytes += 2 * (r - 1) / r * per_tp_rank / layout.dp_shard * reduce_bytes
    fsdp_link = gpu.network_bytes_per_s if layout.nodes > 1 else gpu.node_link_bytes_per_s
    tp_bytes = (
        TP_COLLECTIVES_PER_BLOCK
        * layout.n_layers
        * (layout.tp - 1)
        / layout.tp
        * layout.micro_batch
        * layout.seq_len
        * layout.dim
        * param_bytes
    )
    tp_link = gpu.node_link_bytes_per_s if layout.tp <= gpu.gpus_per_node else gpu.network_bytes_per_s
    return StepTime(
        compute, layout.accumulation * fsdp_bytes / fsdp_link, layout.accumulation * tp_bytes / tp_link, calibration
    )
