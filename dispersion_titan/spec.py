"""Registers the ``gpt2`` TrainSpec with TorchTitan."""

from __future__ import annotations

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.protocols.train_spec import TrainSpec, get_train_spec, register_train_spec

from .data.packed import build_packed_dataloader
from .models.gpt2.args import gpt2_flavors
from .models.gpt2.model import GPT2
from .models.gpt2.parallelize import parallelize_gpt2
from .models.gpt2.state_dict_adapter import GPT2StateDictAdapter
from .tokenizer import build_gpt2_tokenizer
from .trainer import build_dispersion_metrics_processor
from .validate import build_packed_validator

MODEL_NAME = "gpt2"


def gpt2_train_spec() -> TrainSpec:
    return TrainSpec(
        model_cls=GPT2,
        model_args=gpt2_flavors,
        parallelize_fn=parallelize_gpt2,
        pipelining_fn=None,
        build_optimizers_fn=build_optimizers,
        build_lr_schedulers_fn=build_lr_schedulers,
        build_dataloader_fn=build_packed_dataloader,
        build_tokenizer_fn=build_gpt2_tokenizer,
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=build_packed_validator,
        build_metrics_processor_fn=build_dispersion_metrics_processor,
        state_dict_adapter=GPT2StateDictAdapter,
    )


def register() -> None:
    """Idempotent: TorchTitan refuses to register a name twice."""
    try:
        get_train_spec(MODEL_NAME)
    except ValueError:
        register_train_spec(MODEL_NAME, gpt2_train_spec())
