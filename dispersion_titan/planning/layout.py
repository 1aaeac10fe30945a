"""The layout a config resolves to on N GPUs, checked as a launch checks it (an impossible one ends in
the launch's one line)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..job_config.checks import data_parallel_degree
from ..job_config.parse import model_args
from ..utils.errors import ArgumentError
from .figures import GPU

if TYPE_CHECKING:
    from ..config.run_config import RunConfig


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

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def describe(self) -> str:
        replicas = f"{self.dp_replicate} replicas × " if self.dp_replicate > 1 else ""
        return (
            f"{replicas}DP shard {self.dp_shard} × TP {self.tp} on {self.gpus} GPUs ({self.nodes} "
            f"node{'s' if self.nodes > 1 else ''}); micro-batch {self.micro_batch} × {self.seq_len} tokens, "
            f"{self.accumulation} accumulation step{'s' if self.accumulation > 1 else ''}; "
            f"{self.tokens_per_step:,} tokens per step"
        )


def nodes_of(gpus: int, nodes: int | None, gpu: GPU) -> int:
    """``--nodes``, or as few as hold ``gpus`` at ``gpu.gpus_per_node`` each; the GPUs split evenly."""
    count = nodes or math.ceil(gpus / gpu.gpus_per_node)
    if gpus % count:
        raise ArgumentError(f"--nodes: {gpus} GPUs do not split evenly over {count} nodes")
    return count


def resolve_layout(job_config: RunConfig, gpus: int, nodes: int) -> ResourceLayout:
    """The layout ``job_config`` (checked for ``gpus`` processes) takes on ``nodes`` nodes."""
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
    )
