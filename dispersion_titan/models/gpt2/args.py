"""GPT-2 model arguments, the published flavors, and FLOP accounting."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar

from torch import nn
from torchtitan.config import JobConfig
from torchtitan.protocols.model import BaseModelArgs

from ...utils.errors import ConfigError
from ..flavors import DROPOUT_KEYS, SHAPE_KEYS, Flavors, ShapeOverrides, pretrained_config, pretrained_folder

GPT2_VOCAB_SIZE = 50257
_REFUSED = {
    "head_dim": "gpt2's head width is dim / n_heads",
    "n_kv_heads": "gpt2 has one key/value head per attention head",
}


@dataclass
class GPT2ModelArgs(ShapeOverrides, BaseModelArgs):
    """Shape of a GPT-2-like model. ``mlp_hidden_dim=0`` means the GPT-2 default, 4·dim."""

    FAMILY: ClassVar[str] = "gpt2"
    REFUSED_BECAUSE: ClassVar[dict[str, str]] = _REFUSED
    OVERRIDES: ClassVar[dict[str, str]] = {k: k for k in (*SHAPE_KEYS, *DROPOUT_KEYS) if k not in _REFUSED}
    HF_FIELDS: ClassVar[dict[str, str]] = {
        "vocab_size": "vocab_size",
        "tie_word_embeddings": "tie_embeddings",
        "n_embd": "dim",
        "n_layer": "n_layers",
        "n_head": "n_heads",
        "n_inner": "mlp_hidden_dim",
        "n_positions": "max_seq_len",
    }

    dim: int = 768
    n_layers: int = 12
    n_heads: int = 12
    mlp_hidden_dim: int = 0
    vocab_size: int = GPT2_VOCAB_SIZE
    max_seq_len: int = 1024  # number of learned positions (GPT-2's n_positions)
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    attn_dropout: float = 0.0  # Hugging Face GPT-2's attn_pdrop: on the attention probabilities
    resid_dropout: float = 0.0  # resid_pdrop: after the attention and MLP output projections
    embd_dropout: float = 0.0  # embd_pdrop: on the token + position embeddings

    @property
    def hidden_dim(self) -> int:
        return self.mlp_hidden_dim or 4 * self.dim

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def positions(self) -> int:
        """Learned positions: the longest sequence the model takes."""
        return self.max_seq_len

    def update_from_config(self, job_config: JobConfig, **kwargs) -> None:
        """Apply the ``[model]`` overrides; an unset dropout takes the loaded GPT-2 folder's (``pretrained_config``)."""
        self.apply_overrides(job_config.model)
        config = pretrained_config(job_config)
        for key, theirs in DROPOUT_KEYS.items():
            if theirs in config and getattr(job_config.model, key) is None:
                try:
                    setattr(self, key, float(config[theirs]))
                except (TypeError, ValueError):  # a hand edit's "x" or [1] (was a traceback)
                    option, folder = pretrained_folder(job_config) or ("", "")
                    raise ConfigError(
                        f"{option}: {os.path.join(folder, 'config.json')}: {theirs} {config[theirs]!r} is no number; "
                        "copy the model's config.json again"
                    ) from None

    def get_nparams_and_flops(self, model: nn.Module, seq_len: int) -> tuple[int, int]:
        """Unique parameter count and training FLOPs per token: 6 per matmul weight (the LM head's d·V
        even when tied) plus 12·L·d·T for attention (PaLM's convention)."""
        nparams = sum(p.numel() for p in model.parameters())
        return nparams, flops_per_token(self, seq_len)


def flops_per_token(args: GPT2ModelArgs, seq_len: int) -> int:
    d, L = args.dim, args.n_layers
    matmul_weights = L * (4 * d * d + 2 * d * args.hidden_dim) + d * args.vocab_size
    return 6 * matmul_weights + 12 * L * d * seq_len


_FLAVORS: dict[str, GPT2ModelArgs] = {
    "debug": GPT2ModelArgs(dim=64, n_layers=4, n_heads=4, max_seq_len=256),
    "small": GPT2ModelArgs(dim=768, n_layers=12, n_heads=12),
    "medium": GPT2ModelArgs(dim=1024, n_layers=24, n_heads=16),
    "large": GPT2ModelArgs(dim=1280, n_layers=36, n_heads=20),
    "xl": GPT2ModelArgs(dim=1600, n_layers=48, n_heads=25),
}


gpt2_flavors = Flavors(_FLAVORS, GPT2ModelArgs)
"""The flavor table; every lookup returns a fresh copy, so config overrides never leak."""
