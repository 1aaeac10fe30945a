"""Llama 3 (TorchTitan's ``llama3``: model, flavors ``debugmodel``, ``8B``, ``70B``,
``405B`` as TorchTitan defines them, parallelize function and HF state-dict adapter),
registered as ``llama3_dispersion`` with dispersion_titan's data, tokenizer and trainer-side
builders. Its MLP width follows from ``dim``, ``multiple_of`` and ``ffn_dim_multiplier``,
and TorchTitan 0.2.2's Llama 3 never ties its LM head."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torchtitan.models.llama3 import Transformer, TransformerModelArgs, llama3_args, parallelize_llama
from torchtitan.models.llama3.model.model import FeedForward
from torchtitan.models.llama3.model.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.protocols.train_spec import TrainSpec

from ..flavors import Flavors
from ..titan_decoders import RotaryOverrides, adapted, offered

MODEL_NAME = "llama3_dispersion"
HF_MODEL_TYPE = "llama"


class Llama3Args(RotaryOverrides, TransformerModelArgs):
    """TorchTitan's Llama 3 arguments, with the MLP width they imply."""

    FAMILY: ClassVar[str] = MODEL_NAME
    OVERRIDES: ClassVar[dict[str, str]] = {k: k for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size")}
    REFUSED_BECAUSE: ClassVar[dict[str, str]] = {
        **RotaryOverrides.REFUSED_BECAUSE,
        "head_dim": "llama3's head width is dim / n_heads",
        "mlp_hidden_dim": "llama3 derives its MLP width from dim, multiple_of and ffn_dim_multiplier",
        "tie_embeddings": "TorchTitan 0.2.2's llama3 has no weight tying",
    }
    tie_embeddings: ClassVar[bool] = False

    @property
    def hidden_dim(self) -> int:
        """The MLP width TorchTitan's FeedForward computes for this shape."""
        with torch.device("meta"):
            return FeedForward(self.dim, 4 * self.dim, self.multiple_of, self.ffn_dim_multiplier).w1.out_features


llama3_flavors = Flavors(llama3_args, Llama3Args, offered)


def get_train_spec() -> TrainSpec:
    from ..spec import dispersion_train_spec  # the trainer side: see models/gpt2/__init__.py

    return dispersion_train_spec(Transformer, llama3_flavors, adapted(parallelize_llama), Llama3StateDictAdapter)


def hf_config(args: Llama3Args, tokenizer: Any):
    """transformers' ``LlamaConfig`` of this shape, with the Llama 3 RoPE scaling that
    TorchTitan's Llama 3 always applies; its positions, as Meta's Llama 3.1 config gives them, the original
    context times the factor (transformers warns of any up to the original; llama3 RoPE does not read them)."""
    scaling = args.rope_scaling_args
    positions = max(args.max_seq_len, int(scaling.original_max_position_embeddings * scaling.scaling_factor))
    return args.hf_config(HF_MODEL_TYPE, "LlamaForCausalLM", tokenizer, max_position_embeddings=positions)
