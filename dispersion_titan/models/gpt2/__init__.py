"""GPT-2: flavors and its TrainSpec; the trainer side is imported only when the spec is built."""

from __future__ import annotations

from typing import Any

from torchtitan.protocols.train_spec import TrainSpec

from .args import GPT2ModelArgs, gpt2_flavors
from .model import GPT2

MODEL_NAME = "gpt2"


def get_train_spec() -> TrainSpec:
    from .. import spec  # the trainer side, as TorchTitan's llama3: .args and .model load without it
    from . import parallelize, state_dict_adapter

    return spec.dispersion_train_spec(
        GPT2, gpt2_flavors, parallelize.parallelize_gpt2, state_dict_adapter.GPT2StateDictAdapter
    )


def hf_config(args: GPT2ModelArgs, tokenizer: Any):
    """transformers' ``GPT2Config`` of this shape, the tokenizer's vocabulary (the export trims a pad)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=tokenizer.vocab_size,
        n_positions=args.max_seq_len,
        n_embd=args.dim,
        n_layer=args.n_layers,
        n_head=args.n_heads,
        n_inner=None if args.hidden_dim == 4 * args.dim else args.hidden_dim,
        activation_function="gelu_new",
        layer_norm_epsilon=args.norm_eps,
        tie_word_embeddings=args.tie_embeddings,
        attn_pdrop=args.attn_dropout,
        resid_pdrop=args.resid_dropout,
        embd_pdrop=args.embd_dropout,
        bos_token_id=tokenizer.eos_id,
        eos_token_id=tokenizer.eos_id,
        architectures=["GPT2LMHeadModel"],
    )
