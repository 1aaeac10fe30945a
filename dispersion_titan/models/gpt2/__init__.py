"""GPT-2: flavors and the TrainSpec that plugs the model into TorchTitan's training loop.

Import-light like TorchTitan's ``models/llama3``: the trainer-side builders are imported
when the spec is built, so ``models.gpt2.args`` / ``.model`` load without the trainer.
"""

from __future__ import annotations

from torchtitan.protocols.train_spec import TrainSpec

from .args import GPT2ModelArgs, gpt2_flavors
from .model import GPT2

MODEL_NAME = "gpt2"

__all__ = ["GPT2", "GPT2ModelArgs", "MODEL_NAME", "get_train_spec", "gpt2_flavors"]


def get_train_spec() -> TrainSpec:
    from ..spec import dispersion_train_spec
    from .parallelize import parallelize_gpt2
    from .state_dict_adapter import GPT2StateDictAdapter

    return dispersion_train_spec(GPT2, gpt2_flavors, parallelize_gpt2, GPT2StateDictAdapter)
