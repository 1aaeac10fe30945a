"""TorchTitan's Validator, fed by the packed held-out split instead of its C4 loader, and run in
micro-batches of the training micro-batch: a whole validation batch's logits alone can exhaust
memory (64 × 1024 × 50257 fp32 logits are 13 GB). The loss is the same sum over the same tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torchtitan.components.validate import Validator

from ..data.packed import build_packed_validation_dataloader
from .titan_compat import init_validator


class _Deferred(torch.nn.Module):
    """The model as the validation loop calls it: its inputs handed on to the loss, which runs the
    model in micro-batches."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        return inputs, kwargs


class PackedValidator(Validator):
    def __init__(self, job_config, dp_world_size: int, dp_rank: int, **fields: Any) -> None:
        init_validator(
            self,
            validation_dataloader=build_packed_validation_dataloader(dp_world_size, dp_rank, job_config),
            job_config=job_config,
            **fields,
        )
        self.micro_batch = job_config.training.local_batch_size

    def post_dataloading_process(
        self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, model_parts
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        """GPT-2 attends causally with SDPA: no attention masks to build."""
        del model_parts
        return input_dict["input"], labels, {k: v for k, v in input_dict.items() if k != "input"}, {}

    def validate(self, model_parts: list[torch.nn.Module], step: int) -> None:
        """TorchTitan's validation loop, its model call and loss run in micro-batches."""
        (model,) = model_parts
        whole_batch_loss = self.loss_fn

        def loss_fn(deferred: tuple[torch.Tensor, dict[str, Any]], labels: torch.Tensor) -> torch.Tensor:
            """The sum of ``whole_batch_loss`` over micro-batches, per-sequence keyword tensors cut along."""
            inputs, kwargs = deferred
            total = None
            for part in (slice(start, start + self.micro_batch) for start in range(0, len(inputs), self.micro_batch)):
                cut = {
                    k: v[part] if torch.is_tensor(v) and v.shape[:1] == inputs.shape[:1] else v
                    for k, v in kwargs.items()
                }
                loss = whole_batch_loss(model(inputs[part], **cut), labels[part])
                total = loss if total is None else total + loss
            return total

        self.loss_fn = loss_fn
        try:
            super().validate([_Deferred(model)], step)
        finally:
            self.loss_fn = whole_batch_loss
