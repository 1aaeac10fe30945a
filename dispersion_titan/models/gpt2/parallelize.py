"""TP (with sequence parallel), activation checkpointing, compile and FSDP2 or DDP for GPT-2, in
llama3's order; the TP plan covers positions and biases, and the weight tie survives TP and FSDP2.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims
from torchtitan.distributed.activation_checkpoint import apply_ac
from torchtitan.models.llama3.infra.parallelize import apply_compile, apply_ddp
from torchtitan.tools.logging import logger

from ..fsdp import shard_keeping_the_tie, shards_one_rank, sum_gradients
from .model import GPT2

SAC_SAVE_LIST = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,  # Linear layers with a bias (all of GPT-2's); else every matmul is recomputed
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_attention_math.default,  # CPU's attention
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}
"""What ``selective_ac_option = "op"`` keeps: the matmuls, attention and the reduce-scatters, as TorchTitan's
own models keep them, and ``addmm``."""


def parallelize_gpt2(model: GPT2, parallel_dims: ParallelDims, job_config: JobConfig) -> nn.Module:
    if parallel_dims.tp_enabled:
        apply_tp(
            model,
            parallel_dims.get_mesh("tp"),
            loss_parallel=not job_config.parallelism.disable_loss_parallel,
        )

    compile_model = job_config.compile.enable and "model" in job_config.compile.components
    if job_config.activation_checkpoint.mode != "none":
        apply_ac(
            model,
            job_config.activation_checkpoint,
            model_compile_enabled=compile_model,
            op_sac_save_list=SAC_SAVE_LIST,
            base_folder=job_config.job.dump_folder,
        )
    whole_model = compile_model and job_config.compile.whole_model
    if compile_model and not whole_model:
        apply_compile(model, job_config.compile)

    if parallel_dims.fsdp_enabled or shards_one_rank(parallel_dims, job_config):
        shard_keeping_the_tie(model, parallel_dims, job_config)
    elif parallel_dims.dp_replicate_enabled:  # replicated parameters: TorchTitan computes under autocast
        apply_ddp(model, parallel_dims.get_mesh("dp_replicate"), enable_compile=compile_model)
        sum_gradients(model, parallel_dims)
    if whole_model:  # after data parallelism, as TorchTitan advises; in place: the state dict keeps its keys
        model.compile(backend=job_config.compile.backend)
        logger.info("Compiling the whole model with torch.compile")
    return model


def apply_tp(model: GPT2, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Megatron-style TP with sequence parallel: activations between blocks sharded along the sequence,
    both embeddings reduce-scattering straight into it."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "pos_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel else Replicate(),
                use_local_output=not loss_parallel,
            ),
        },
    )
    for block in model.layers.values():
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            },
        )
    # embedding and head both shard [V, d] along V: one DTensor serves both
    model.tie_weights()
    logger.info("Applied tensor parallelism (sequence parallel) to GPT-2")
