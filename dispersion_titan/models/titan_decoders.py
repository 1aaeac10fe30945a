"""What TorchTitan's decoders (qwen3, llama3) share as our families: the flavors offered, how their
arguments take ``[model]``, and their parallelize functions adjusted: a tied model's FSDP is ours (theirs
shards the embeddings and the head apart), as on one process with mixed precision; gradients are summed,
not averaged; on a CPU, TP attention runs on local shards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

from torch import nn
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims

from ..components import titan_compat
from .flavors import ShapeOverrides
from .fsdp import shard_keeping_the_tie, shards_one_rank, sum_gradients


def offered(args: Any) -> bool:
    """A dense flavor with SDPA attention (causal, no masks to build)."""
    return not getattr(args, "moe_enabled", False) and args.attn_type == "sdpa"


class RotaryOverrides(ShapeOverrides):
    """TorchTitan's ``update_from_config``, the RoPE table sized for validation too, the ``[model]`` keys."""

    positions: ClassVar[None] = None
    """No learned positions: any sequence length is accepted."""
    REFUSED_BECAUSE: ClassVar[dict[str, str]] = {
        "max_seq_len": "rotary positions: the RoPE table follows training.seq_len and validation.seq_len",
    }
    HF_FIELDS: ClassVar[dict[str, str]] = {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "num_key_value_heads": "n_kv_heads",
        "intermediate_size": "mlp_hidden_dim",
        "vocab_size": "vocab_size",
        "tie_word_embeddings": "tie_embeddings",
    }

    def update_from_config(self, job_config: JobConfig, **kwargs) -> None:
        validation = job_config.validation.seq_len if job_config.validation.enable else 0
        longest = max(job_config.training.seq_len, validation)
        # sized first: TorchTitan's "Sequence length exceeds original maximum" compares with the flavor's table,
        # not a pretrained model's positions (a run beyond those is told so by checks.launch_notes, with the folder)
        self.max_seq_len = longest
        super().update_from_config(job_config, **kwargs)  # sets training.seq_len's
        self.max_seq_len = longest
        self.apply_overrides(job_config.model)

    def rope_parameters(self) -> dict[str, Any]:
        """transformers' ``rope_parameters`` of this model (TorchTitan's llama3 always applies its scaling)."""
        rope = {"rope_type": "default", "rope_theta": float(self.rope_theta)}  # type: ignore[attr-defined]
        if scaling := getattr(self, "rope_scaling_args", None):
            rope |= {
                "rope_type": "llama3",
                "factor": scaling.scaling_factor,
                "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position_embeddings,
            }
        return rope

    def hf_config(self, model_type: str, architecture: str, tokenizer: Any, **fields: Any) -> Any:
        """With its RoPE and RMSNorm; ``max_position_embeddings`` given in ``fields``."""
        extra = {"rope_parameters": self.rope_parameters(), "rms_norm_eps": self.norm_eps}  # type: ignore[attr-defined]
        return super().hf_config(model_type, architecture, tokenizer, **extra, **fields)

    def get_nparams_and_flops(self, model: Any, seq_len: int) -> tuple[int, int]:
        """TorchTitan's count with a tied LM head's 6·d·V FLOPs a token added back (it drops the
        embedding's parameters, and a tied head has none of its own)."""
        nparams, flops = super().get_nparams_and_flops(model, seq_len)
        return nparams, flops + (6 * self.dim * self.vocab_size if self.tie_embeddings else 0)


def adapted(parallelize_fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """``parallelize_fn`` with the adjustments above."""

    @functools.wraps(parallelize_fn)
    def parallelize(model: nn.Module, parallel_dims: ParallelDims, job_config: JobConfig) -> nn.Module:
        tied = model.model_args.tie_embeddings
        if (tied and parallel_dims.fsdp_enabled) or shards_one_rank(parallel_dims, job_config):
            model = parallelize_fn(model, titan_compat.WithoutDataParallel(parallel_dims), job_config)
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
