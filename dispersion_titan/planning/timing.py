"""A step's predicted time: its calibrated roofline compute plus the dispersion term, the data-parallel
collectives overlapped with it, tensor parallelism's on the critical path. A collective costs its
bytes at its link's bandwidth plus NCCL's ring latency; no layout beats one GPU's per-token time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .figures import GPU, Calibration
from .layout import ResourceLayout

if TYPE_CHECKING:
    from ..config.run_config import RunConfig
    from .step_measure import StepMeasurement

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
TP_COLLECTIVES_PER_BLOCK = 8
"""Sequence parallel: an all-gather before and a reduce-scatter after attention and the MLP,
forward, and the same in backward."""
RING_BASE_S, RING_HOP_NVLINK_S, RING_HOP_NETWORK_S = 8.4e-6, 3.4e-6, 14.0e-6
"""NCCL's tuning model of a ring (``baseLat``, ``hwLat`` in its ``src/graph/tuning.cc``), not ours."""
DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's default ``bucket_cap_mb``: gradients are all-reduced in buckets of 25 MiB."""


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
    data_parallel: str = "FSDP collectives"
    one_gpu_s: float = 0.0
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
    """One optimizer step of ``layout`` on ``gpu`` from ``m``; ``one_gpu_s``: its least time (0: none)."""
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
        size = per_tp_rank * reduce_bytes
        latency = math.ceil(size / DDP_BUCKET_BYTES) * ring_latency_s(r, layout.nodes, all_reduce=True)
        data_parallel = latency + 2 * (r - 1) / r * size / link
        name = "DDP all-reduce"
    else:  # FSDP, each micro-batch: all-gather forward and again in backward, reduce-scatter the gradients
        per_micro_batch = units * 3 * ring_latency_s(shard, shard_nodes)
        size = (shard - 1) / shard * per_tp_rank * (2 * param_bytes + reduce_bytes) if shard > 1 else 0.0
        if r > 1:  # HSDP: the shards' gradients all-reduced over the replicas
            per_micro_batch += units * ring_latency_s(r, min(r, layout.nodes), all_reduce=True)
            size += 2 * (r - 1) / r * per_tp_rank / shard * reduce_bytes
        latency = layout.accumulation * per_micro_batch
        data_parallel = latency + layout.accumulation * size / link
        name = "HSDP collectives" if r > 1 else "FSDP collectives"
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
    tp_nodes = math.ceil(layout.tp / gpu.gpus_per_node)
    tp_latency = TP_COLLECTIVES_PER_BLOCK * layout.n_layers * ring_latency_s(layout.tp, tp_nodes)
    tp = layout.accumulation * (tp_bytes / tp_link + tp_latency)
    return StepTime(compute, data_parallel, latency, tp, calibration, name, one_gpu_s)
