"""TorchTitan's parallelize functions (qwen3's, llama3's), but: a tied model's FSDP is ours (theirs
shards the embeddings and the head apart), as on one process with mixed precision; gradients are
summed, not averaged; on a CPU, TP attention runs on local shards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims

from ..components import titan_compat
from .fsdp import shard_keeping_the_tie, shards_one_rank, sum_gradients


def adapted(parallelize_fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``parallelize_fn`` with the adjustments above."""

    @functools.wraps(parallelize_fn)
    def parallelize(model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig) -> nn.Module:
        tied = model.model_args.tie_embeddings
        if (tied and parallel_dims.fsdp_enabled) or shards_one_rank(parallel_dims, job_config):
            model = parallelize_fn(model, titan_compat.without_data_parallel(parallel_dims), job_config)
            if tied:
                model.output.weight = model.tok_embeddings.weight  # tensor parallelism made two DTensors of it
            shard_keeping_the_tie(model, parallel_dims, job_config)
        else:
            model = parallelize_fn(model, parallel_dims, job_config)
            sum_gradients(model, parallel_dims)
        if parallel_dims.tp_enabled and titan_compat.uses_cpu():
            titan_compat.attention_on_local_shards(model)
        return model

    return parallelize
