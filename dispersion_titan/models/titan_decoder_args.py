"""What TorchTitan's own decoders (qwen3, llama3) share as dispersion_titan families:
which of their flavors are offered, and how their arguments take ``[model]``.

Their model classes, flavor values, parallelize functions and state-dict adapters are
TorchTitan's, used as they are. Offered are the dense flavors with SDPA attention
(causal, no masks to build): the MoE flavors and the flex/varlen-attention ones are not.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torchtitan.config import JobConfig

from .flavors import ShapeOverrides


def offered(args: Any) -> bool:
    """A dense flavor with SDPA attention."""
    return not getattr(args, "moe_enabled", False) and args.attn_type == "sdpa"


def rotary_table_length(job_config: JobConfig) -> int:
    """Positions the RoPE table must cover: the longest training or validation sequence."""
    lengths = [job_config.training.seq_len]
    if job_config.validation.enable:
        lengths.append(job_config.validation.seq_len)
    return max(lengths)


class RotaryOverrides(ShapeOverrides):
    """``update_from_config`` of a TorchTitan decoder with rotary positions: TorchTitan's
    own, then the RoPE table sized for validation too, then the ``[model]`` keys."""

    positions: ClassVar[None] = None
    """No learned positions: any sequence length is accepted."""
    ROTARY_REFUSED: ClassVar[dict[str, str]] = {
        "max_seq_len": "rotary positions: the RoPE table follows training.seq_len and validation.seq_len",
    }

    def update_from_config(self, job_config: JobConfig, **kwargs) -> None:
        super().update_from_config(job_config, **kwargs)
        self.max_seq_len = rotary_table_length(job_config)
        self.apply_overrides(job_config.model)

    def get_nparams_and_flops(self, model: Any, seq_len: int) -> tuple[int, int]:
        """TorchTitan's count (what its ``mfu`` line divides) with a tied LM head's 6·d·V
        FLOPs a token added back: TorchTitan drops the embedding's parameters from the count,
        and a tied head has none of its own, so Qwen3-0.6B's head (15% of its FLOPs) was
        missing (tests/test_flops.py checks the count against FlopCounterMode)."""
        nparams, flops = super().get_nparams_and_flops(model, seq_len)
        return nparams, flops + (6 * self.dim * self.vocab_size if self.tie_embeddings else 0)


def hf_decoder_fields(args: Any, tokenizer: Any) -> dict[str, Any]:
    """The ``transformers`` config fields that Qwen3's and Llama 3's share, from TorchTitan's
    arguments; the tokenizer's end-of-sequence id is also the BOS id."""
    return {
        "vocab_size": args.vocab_size,
        "hidden_size": args.dim,
        "intermediate_size": args.hidden_dim,
        "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads,
        "num_key_value_heads": args.n_kv_heads or args.n_heads,
        "rms_norm_eps": args.norm_eps,
        "bos_token_id": tokenizer.eos_id,
        "eos_token_id": tokenizer.eos_id,
    }
