"""What TorchTitan's decoders (qwen3, llama3) share as our families: the flavors offered and how their
arguments take ``[model]``."""

from __future__ import annotations

from typing import Any, ClassVar

from torchtitan.config import JobConfig

from .flavors import ShapeOverrides


def offered(args: Any) -> bool:
    """A dense flavor with SDPA attention (causal, no masks to build)."""
    return not getattr(args, "moe_enabled", False) and args.attn_type == "sdpa"


class RotaryOverrides(ShapeOverrides):
    """TorchTitan's ``update_from_config``, the RoPE table sized for validation too, the ``[model]`` keys."""

    positions: ClassVar[None] = None
    """No learned positions: any sequence length is accepted."""
    ROTARY_REFUSED: ClassVar[dict[str, str]] = {
        "max_seq_len": "rotary positions: the RoPE table follows training.seq_len and validation.seq_len",
    }

    def update_from_config(self, job_config: JobConfig, **kwargs) -> None:
        super().update_from_config(job_config, **kwargs)
        validation = job_config.validation.seq_len if job_config.validation.enable else 0
        self.max_seq_len = max(job_config.training.seq_len, validation)
        self.apply_overrides(job_config.model)

    def get_nparams_and_flops(self, model: Any, seq_len: int) -> tuple[int, int]:
        """TorchTitan's count with a tied LM head's 6·d·V FLOPs a token added back (it drops the
        embedding's parameters, and a tied head has none of its own)."""
        nparams, flops = super().get_nparams_and_flops(model, seq_len)
        return nparams, flops + (6 * self.dim * self.vocab_size if self.tie_embeddings else 0)


def hf_decoder_fields(args: Any, tokenizer: Any) -> dict[str, Any]:
    """The ``transformers`` config fields Qwen3's and Llama 3's share (EOS also as BOS)."""
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
