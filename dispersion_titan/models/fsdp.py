"""Data parallelism as every family needs it: gradients summed by FSDP2 and DDP, a tied LM head kept
one parameter under FSDP2, and a sharding config's mixed precision on one rank too.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.distributed._composable.replicate import DDP
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP, JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger


def shards_one_rank(parallel_dims: ParallelDims, job_config: JobConfig) -> bool:
    """Whether FSDP2 goes on a one-rank mesh: a sharding config with mixed precision on one process,
    where TorchTitan would compute under autocast, not in bf16 as the same config on more ranks."""
    return (
        parallel_dims.world_size == 1
        and job_config.parallelism.data_parallel_shard_degree != 1
        and job_config.training.mixed_precision_param != "float32"
    )


def sum_gradients(model: nn.Module, parallel_dims: ParallelDims) -> None:
    """Sum gradients over data-parallel ranks (TorchTitan divides the loss by the global token count):
    FSDP's units, and DDP through a SUM communication hook."""
    _sum_sharded_gradients(model)
    if isinstance(model, DDP):
        model.register_comm_hook(parallel_dims.get_mesh("dp_replicate").get_group(), _summed)


def sync_last_microbatch(model: nn.Module, microbatch: int, count: int) -> None:
    """DDP all-reduces in the last micro-batch's backward only (else it would sum the sums again)."""
    if isinstance(model, DDP):
        model.set_requires_gradient_sync(microbatch == count)


def _sum_sharded_gradients(model: nn.Module) -> None:
    """Divide factor 1 in every FSDP unit (a plain SUM on gloo, which lacks PREMUL_SUM)."""
    force_sum = dist.is_initialized() and dist.get_backend() == "gloo"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if force_sum:
                module.set_force_sum_reduction_for_comms(True)


def _summed(group, bucket):  # noqa: ANN001 - DDP checks the annotations, which this module's are strings
    """DDP's default hook without its division by the group size: the bucket, summed in place (a fake
    backend's future holds no value: plan --dry-run-step)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda _: bucket.buffer())


def shard_keeping_the_tie(model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig) -> None:
    """One FSDP unit per block, the embeddings, norm and (tied) head in the root unit, as the job configures them
    (on one rank over the world mesh, without resharding); gradients summed."""
    training = job_config.training
    one_rank = not parallel_dims.fsdp_enabled
    names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
    config = {
        "mesh": parallel_dims.world_mesh if one_rank else parallel_dims.get_mesh(names),
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
            reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce],
        ),
        "offload_policy": CPUOffloadPolicy() if training.enable_cpu_offload else OffloadPolicy(),
    }
    reshard = not one_rank and job_config.parallelism.fsdp_reshard_after_forward != "never"
    for block in model.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    fully_shard(model, **config)
    _sum_sharded_gradients(model)
    where = " on one rank (its mixed precision, no autocast)" if one_rank else ""
    logger.info(f"Applied FSDP2{where} to {job_config.model.name}, the embeddings and the LM head in the root unit")
