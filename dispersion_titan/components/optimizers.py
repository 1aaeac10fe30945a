"""Every TrainSpec's optimizer and LR-scheduler builders: TorchTitan's own, except
under active forgetting, where the token embeddings get a param group of their own with
a sawtooth schedule (peak ``embedding_lr``, linear warm-up over 8% of each period, then
linear decay, restarting at every reset) while the body keeps the run's schedule.

TorchTitan calls these builders with the ``[optimizer]`` / ``[lr_scheduler]`` sections
only; the launch checks put the run's ``[baseline]`` section into both (their ``baseline``
field, ``config.schema.BuilderInputs``). Without active forgetting, they are TorchTitan's.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torchtitan.components.lr_scheduler import LRSchedulersContainer, build_lr_schedulers
from torchtitan.components.optimizer import OptimizersContainer, build_optimizers

from ..config.schema import Baseline
from . import titan_compat

WARMUP_FRACTION = 0.08


def _forgetting(section: Any) -> Baseline | None:
    """The ``[baseline]`` section that ``section`` (``[optimizer]`` or ``[lr_scheduler]``) carries,
    when its method is active forgetting."""
    baseline = section.baseline
    return baseline if baseline is not None and baseline.method == "active_forgetting" else None


def embedding_warmup_steps(period: int) -> int:
    return max(1, round(WARMUP_FRACTION * period))


def embedding_lr_factor(completed_steps: int, period: int) -> float:
    """Factor of ``embedding_lr`` for the step after ``completed_steps`` (``LambdaLR``'s
    epoch): TorchTitan's linear warm-up then linear decay, restarted every ``period`` steps."""
    t, warmup = completed_steps % period, embedding_warmup_steps(period)
    return (t + 1) / warmup if t < warmup else (period - t) / (period - warmup)


def token_embedding(model: nn.Module) -> nn.Parameter:
    """The token embedding matrix (the LM head too when tied)."""
    return model.tok_embeddings.weight


def _separate_embedding_group(model: nn.Module, optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Param group 0 keeps the body, group 1 takes the token embeddings."""
    embedding = token_embedding(model)
    (group,) = optimizer.param_groups
    group["params"] = [p for p in group["params"] if p is not embedding]
    optimizer.add_param_group({"params": [embedding], "lr": lr})


def build_dispersion_optimizers(model_parts: list[nn.Module], optimizer_config: Any, parallel_dims: Any,
                          ft_manager: Any = None) -> OptimizersContainer:
    optimizers = build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
    forgetting = _forgetting(optimizer_config)
    if forgetting is not None:
        for model, optimizer in titan_compat.optimizer_per_model_part(optimizers):
            _separate_embedding_group(model, optimizer, forgetting.embedding_lr)
    return optimizers


def build_dispersion_lr_schedulers(optimizers: OptimizersContainer, lr_scheduler_config: Any,
                             training_steps: int) -> LRSchedulersContainer:
    forgetting = _forgetting(lr_scheduler_config)
    if forgetting is None:
        return build_lr_schedulers(optimizers, lr_scheduler_config, training_steps)
    body = titan_compat.lr_lambda(lr_scheduler_config, training_steps)
    sawtooth = functools.partial(embedding_lr_factor, period=forgetting.forget_every)
    return titan_compat.lr_schedulers_per_group(optimizers, [body, sawtooth])
