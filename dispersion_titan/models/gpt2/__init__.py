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
    from torchtitan.components.loss import build_cross_entropy_loss

    from ...data.packed import build_packed_dataloader
    from ...tokenizer import build_gpt2_tokenizer
    from ...trainer.metrics import build_dispersion_metrics_processor
    from ...trainer.optimizers import build_gpt2_lr_schedulers, build_gpt2_optimizers
    from ...trainer.validate import build_packed_validator
    from .parallelize import parallelize_gpt2
    from .state_dict_adapter import GPT2StateDictAdapter

    return TrainSpec(
        model_cls=GPT2,
        model_args=gpt2_flavors,
        parallelize_fn=parallelize_gpt2,
        pipelining_fn=None,
        build_optimizers_fn=build_gpt2_optimizers,
        build_lr_schedulers_fn=build_gpt2_lr_schedulers,
        build_dataloader_fn=build_packed_dataloader,
        build_tokenizer_fn=build_gpt2_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=build_packed_validator,
        build_metrics_processor_fn=build_dispersion_metrics_processor,
        state_dict_adapter=GPT2StateDictAdapter,
    )
