"""GPT-2: flavors and its TrainSpec; the trainer side is imported only when the spec is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..flavors import DROPOUT_KEYS
from .args import GPT2ModelArgs, gpt2_flavors
from .model import GPT2

if TYPE_CHECKING:
    from torchtitan.protocols.train_spec import TrainSpec

MODEL_NAME = "gpt2"
HF_MODEL_TYPE = "gpt2"


def get_train_spec() -> TrainSpec:
    from .. import spec  # the trainer side, as TorchTitan's llama3: .args and .model load without it
    from . import parallelize, state_dict_adapter

    return spec.dispersion_train_spec(
        GPT2, gpt2_flavors, parallelize.parallelize_gpt2, state_dict_adapter.GPT2StateDictAdapter
    )


def hf_config(args: GPT2ModelArgs, tokenizer: Any):
    """transformers' ``GPT2Config`` of this shape, the tokenizer's vocabulary (the export trims a pad)."""
    fields = {theirs: getattr(args, ours) for ours, theirs in DROPOUT_KEYS.items()}
    if args.hidden_dim == 4 * args.dim:
        fields["n_inner"] = None  # GPT-2's own
    return args.hf_config(
        HF_MODEL_TYPE,
        "GPT2LMHeadModel",
        tokenizer,
        **fields | {"vocab_size": tokenizer.vocab_size},
        activation_function="gelu_new",
        layer_norm_epsilon=args.norm_eps,
    )
