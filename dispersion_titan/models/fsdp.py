"""FSDP2 gradients summed over data-parallel ranks, on NCCL and on gloo alike."""

from __future__ import annotations

import functools
from collections.abc import Callable

from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..trainer import titan_compat


def sum_gradients(model: nn.Module) -> None:
    """TorchTitan normalises the loss by the global token count itself, so FSDP must sum
    gradients (divide factor 1); gloo lacks the PREMUL_SUM that FSDP2 then uses for its
    reduce-scatter, so there the sum is a plain SUM."""
    force_sum = titan_compat.backend_needs_sum_reduction()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            if force_sum:
                module.set_force_sum_reduction_for_comms(True)


def summing_gradients(parallelize_fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """A TorchTitan ``parallelize_fn`` followed by ``sum_gradients`` (it already divides by 1)."""

    @functools.wraps(parallelize_fn)
    def parallelize(model: nn.Module, *args, **kwargs) -> nn.Module:
        model = parallelize_fn(model, *args, **kwargs)
        sum_gradients(model)
        return model

    return parallelize
