"""The TrainSpec every family registers: its model around our data and builders."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.protocols.train_spec import TrainSpec

from ..components.metrics import DispersionMetricsProcessor
from ..components.optimizers import build_dispersion_lr_schedulers, build_dispersion_optimizers
from ..components.validate import PackedValidator
from ..data.packed import build_packed_dataloader


def dispersion_train_spec(
    model_cls: type, flavors: Mapping[str, Any], parallelize_fn: Callable[..., Any], state_dict_adapter: type
) -> TrainSpec:
    return TrainSpec(
        model_cls=model_cls,
        model_args=flavors,
        parallelize_fn=parallelize_fn,
        pipelining_fn=None,
        build_optimizers_fn=build_dispersion_optimizers,
        build_lr_schedulers_fn=build_dispersion_lr_schedulers,
        build_dataloader_fn=build_packed_dataloader,
        build_tokenizer_fn=None,  # no consumer: our data, validator and SDPA attention read no tokenizer
        build_loss_fn=build_cross_entropy_loss,
        build_validator_fn=PackedValidator,
        build_metrics_processor_fn=DispersionMetricsProcessor,
        state_dict_adapter=state_dict_adapter,
    )
