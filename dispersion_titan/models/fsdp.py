"""FSDP2 as every family needs it: gradients summed over data-parallel ranks (on NCCL and
on gloo alike), and a tied LM head kept one parameter (one unit per block, and the
embeddings, final norm and head in the root unit, so the shared parameter is managed once).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torchtitan.config import TORCH_DTYPE_MAP, JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.tools.logging import logger

from ..trainer import titan_compat


def sum_gradients(model: nn.Module) -> None:
    """TorchTitan normalises the loss by the global token count itself, so FSDP must sum
    gradients (divide factor 1); gloo lacks the PREMUL_SUM that FSDP2 then uses for its
    reduce-scatter, so there the sum is a plain SUM."""
    force_sum = titan_compat.backend_needs_sum_reduction()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if force_sum:
                module.set_force_sum_reduction_for_comms(True)


def shard_keeping_the_tie(model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig) -> None:
    """FSDP2 (HSDP with replicas): one unit per block; the embeddings, final norm and the
    (tied) head stay in the root unit."""
    training = job_config.training
    names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
    config: dict = {
        "mesh": parallel_dims.get_mesh(names),
        "mp_policy": MixedPrecisionPolicy(param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
                                          reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce]),
    }
    if training.enable_cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()
    reshard = job_config.parallelism.fsdp_reshard_after_forward != "never"
    for block in model.layers.values():
        fully_shard(block, **config, reshard_after_forward=reshard)
    fully_shard(model, **config)
    sum_gradients(model)
    logger.info(f"Applied FSDP2 to {job_config.model.name}, the tied embeddings and LM head in the root unit")
