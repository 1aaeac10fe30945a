"""Qwen3 (TorchTitan's ``qwen3``: model, flavors ``debugmodel``, ``0.6B``, ``1.7B`` … as
TorchTitan defines them, parallelize function and HF state-dict adapter), registered
as ``qwen3_dispersion`` with dispersion_titan's data, tokenizer and trainer-side builders."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torchtitan.models.qwen3 import Qwen3Model, Qwen3ModelArgs, parallelize_qwen3, qwen3_args
from torchtitan.models.qwen3.model.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.train_spec import TrainSpec

from ..flavors import Flavors, pretrained_config
from ..titan_decoders import RotaryOverrides, adapted, offered

MODEL_NAME = "qwen3_dispersion"
HF_MODEL_TYPE = "qwen3"


@dataclass
class Qwen3Args(RotaryOverrides, Qwen3ModelArgs):
    """TorchTitan's Qwen3 arguments; ``model.mlp_hidden_dim`` sets ``hidden_dim`` and
    ``model.tie_embeddings`` sets ``enable_weight_tying``."""

    hf_positions: int = 0
    """``max_position_embeddings`` of the Hugging Face model the run starts from (0: none). Its export keeps it,
    so lm-eval's context (``max_length``) is that model's, as in the authors' in-training evaluation, not the
    run's training length."""

    FAMILY: ClassVar[str] = MODEL_NAME
    OVERRIDES: ClassVar[dict[str, str]] = {
        **{k: k for k in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "vocab_size")},
        "mlp_hidden_dim": "hidden_dim",
        "tie_embeddings": "enable_weight_tying",
    }
    HF_FIELDS: ClassVar[dict[str, str]] = {**RotaryOverrides.HF_FIELDS, "head_dim": "head_dim"}

    def update_from_config(self, job_config: Any, **kwargs: Any) -> None:
        super().update_from_config(job_config, **kwargs)
        positions = pretrained_config(job_config).get("max_position_embeddings")
        self.hf_positions = positions if isinstance(positions, int) else 0  # a hand edit's "x": none (was a traceback)

    @property
    def tie_embeddings(self) -> bool:
        return self.enable_weight_tying


qwen3_flavors = Flavors(qwen3_args, Qwen3Args, offered)


def get_train_spec() -> TrainSpec:
    from ..spec import dispersion_train_spec  # the trainer side: see models/gpt2/__init__.py

    return dispersion_train_spec(Qwen3Model, qwen3_flavors, adapted(parallelize_qwen3), Qwen3StateDictAdapter)


def hf_config(args: Qwen3Args, tokenizer: Any):
    """transformers' ``Qwen3Config`` of this shape (all embedding rows kept, as Qwen's own
    checkpoints pad theirs); its positions those of the model it started from, else those it trained with."""
    positions = max(args.max_seq_len, args.hf_positions)
    return args.hf_config(HF_MODEL_TYPE, "Qwen3ForCausalLM", tokenizer, max_position_embeddings=positions)
