"""TorchTitan's own parallelize functions (qwen3's, llama3's), used as they are but for
what they get wrong here:

- TorchTitan 0.2.2 shards Qwen3's token embeddings and its ``[norm, output]`` as separate
  FSDP units, which FSDP2 refuses when the two share their matrix (the small Qwen3
  flavors tie it). For a tied model the data parallelism is ours (``fsdp``), as for GPT-2;
  tensor parallelism, activation checkpointing and compile stay TorchTitan's. So is it on one
  process with mixed precision (``fsdp.shards_one_rank``), where TorchTitan applies none.
- Gradients are summed over data-parallel ranks, by FSDP (on gloo too) and by DDP
  (``fsdp.sum_gradients``); TorchTitan's DDP would average them.
- Their tensor-parallel attention hands DTensors to SDPA, which DTensor cannot run on a
  CPU: there each rank computes its own heads (``titan_compat.attention_on_local_shards``).
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
