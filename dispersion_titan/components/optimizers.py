"""Every TrainSpec's optimizer and LR-scheduler builders: TorchTitan's own, plus the token
embeddings' own param group and schedule under active forgetting (``embedding_lr_factor``), a
no-decay group (``optimizer.decay_groups``) and transformers' cosine schedule
(``lr_scheduler.form = "as_released"``). TorchTitan hands them only their own section; the launch
checks put ``[baseline]`` into both (``config.schema.BuilderInputs``)."""

from __future__ import annotations

import functools
import math
from typing import Any

from torch import nn
from torchtitan.components.lr_scheduler import LRSchedulersContainer, build_lr_schedulers
from torchtitan.components.optimizer import OptimizersContainer, build_optimizers

from ..config.schema import Baseline
from . import titan_compat

MOMENT_BYTES_PER_PARAM = 2 * 4
"""Adam's and AdamW's two fp32 moments, beside the fp32 weights (4 bytes a parameter) that a checkpoint saves."""
WARMUP_FRACTION = 0.08
BODY_WARMUP_FRACTION = 0.2
"""The authors' ActiveForgettingLRScheduler: the body's warm-up is ⌊0.2·T⌋ steps (their af_body_warmup_ratio)."""
_NO_DECAY_NAMES = ["bias", "layernorm", "rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]
"""transformers' ``Trainer.get_decay_parameter_names`` patterns, searched in the lower-cased name."""


def _forgetting(section: Any) -> Baseline | None:
    """The ``[baseline]`` that ``section`` carries, when its method is active forgetting."""
    baseline = section.baseline
    return baseline if baseline is not None and baseline.method == "active_forgetting" else None


def embedding_lr_factor(completed_steps: int, period: int, total: int) -> float:
    """Factor of ``embedding_lr`` at step g = ``completed_steps`` + 1 of T = ``total``, resets every K =
    ``period``, as the authors' ``ActiveForgettingLRScheduler``: index min((g·⌊T/K⌋) mod T, T−1) on a
    linear warm-up over ⌊0.08·T⌋ steps then linear decay to 0 at T."""
    index = min(((completed_steps + 1) * (total // period)) % total, total - 1)
    warmup = int(total * WARMUP_FRACTION)
    if index < warmup:
        return index / max(1, warmup)
    return max(0.0, (total - index) / max(1, total - warmup))


def body_warmup_steps(warmup_steps: int, total: int, forgetting: bool) -> int:
    """The body's warm-up under ``lr_scheduler.form = "as_released"``: ⌊0.2·T⌋ under active forgetting (the
    authors' ActiveForgettingLRScheduler), else ``warmup_steps``."""
    return int(BODY_WARMUP_FRACTION * total) if forgetting else warmup_steps


def released_lr_factor(step: int, warmup: int, total: int, min_lr_factor: float = 0.0) -> float:
    """transformers' ``get_cosine_schedule_with_warmup`` at ``LambdaLR`` step ``step`` (0 first): s/W
    over W warm-up steps, then half a cosine to 0 at T, scaled into [min_lr_factor, 1] as TorchTitan's."""
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return min_lr_factor + (1 - min_lr_factor) * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def no_decay_parameter_names(model: nn.Module, hf: bool = True) -> set[str]:
    """What the Hugging Face Trainer exempts from weight decay (``get_decay_parameter_names``): LayerNorm
    parameters and names saying bias or norm; ``hf`` False: LayerNorm's and bias only, as the authors'
    active-forgetting optimizer."""
    from transformers.trainer_pt_utils import get_parameter_names  # the walk both use, names outside LayerNorms

    decayed = get_parameter_names(model, [nn.LayerNorm], _NO_DECAY_NAMES if hf else ["bias"])
    return {name for name, _ in model.named_parameters()} - set(decayed)


def build_dispersion_optimizers(
    model_parts: list[nn.Module], optimizer_config: Any, parallel_dims: Any, ft_manager: Any = None
) -> OptimizersContainer:
    optimizers = build_optimizers(model_parts, optimizer_config, parallel_dims, ft_manager)
    forgetting = _forgetting(optimizer_config)
    for model, optimizer in titan_compat.optimizer_per_model_part(optimizers):
        if forgetting is not None:  # group 0 keeps the body, group 1 takes the token embeddings (the LM head if tied)
            embedding = model.tok_embeddings.weight
            (group,) = optimizer.param_groups
            group["params"] = [p for p in group["params"] if p is not embedding]
            optimizer.add_param_group({"params": [embedding], "lr": forgetting.embedding_lr})
        if optimizer_config.decay_groups != "all":  # the exempt parameters to a last group with weight decay 0
            names = no_decay_parameter_names(model, hf=optimizer_config.decay_groups == "hf" or forgetting is None)
            exempt = {id(p) for name, p in model.named_parameters() if name in names}
            group = optimizer.param_groups[0]
            body = group["params"]
            group["params"] = [p for p in body if id(p) not in exempt]
            optimizer.add_param_group({"params": [p for p in body if id(p) in exempt], "weight_decay": 0.0})
    return optimizers


def build_dispersion_lr_schedulers(
    optimizers: OptimizersContainer, lr_scheduler_config: Any, training_steps: int
) -> LRSchedulersContainer:
    forgetting = _forgetting(lr_scheduler_config)
    released = lr_scheduler_config.form == "as_released"
    if forgetting is None and not released:  # TorchTitan's schedule for every param group
        return build_lr_schedulers(optimizers, lr_scheduler_config, training_steps)
    if released:
        total = lr_scheduler_config.total_steps or training_steps
        warmup = body_warmup_steps(lr_scheduler_config.warmup_steps, total, forgetting is not None)
        body = functools.partial(
            released_lr_factor, warmup=warmup, total=total, min_lr_factor=lr_scheduler_config.min_lr_factor
        )
    else:
        body = titan_compat.lr_lambda(lr_scheduler_config, training_steps)
    factors = [body] * len(titan_compat.optimizer_per_model_part(optimizers)[0][1].param_groups)
    if forgetting is not None:  # group 1: the token embeddings (build_dispersion_optimizers)
        factors[1] = functools.partial(embedding_lr_factor, period=forgetting.forget_every, total=training_steps)
    return titan_compat.lr_schedulers_per_group(optimizers, factors)
