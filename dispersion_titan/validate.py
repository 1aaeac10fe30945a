"""TorchTitan's Validator, fed by the packed held-out split instead of its C4 loader."""

from __future__ import annotations

from typing import Any

import torch
from torchtitan.components.validate import BaseValidator, Validator

from .data.packed import build_packed_validation_dataloader


class PackedValidator(Validator):
    def __init__(self, job_config, dp_world_size: int, dp_rank: int, tokenizer, parallel_dims, loss_fn,
                 validation_context, maybe_enable_amp, metrics_processor, pp_schedule=None,
                 pp_has_first_stage=None, pp_has_last_stage=None):
        # Validator.__init__ would build TorchTitan's own text loader; set its fields here.
        BaseValidator.__init__(self, job_config)
        self.tokenizer = tokenizer
        self.parallel_dims = parallel_dims
        self.loss_fn = loss_fn
        self.validation_dataloader = build_packed_validation_dataloader(dp_world_size, dp_rank, job_config)
        self.validation_context = validation_context
        self.maybe_enable_amp = maybe_enable_amp
        self.metrics_processor = metrics_processor
        self.pp_schedule = pp_schedule
        self.pp_has_first_stage = pp_has_first_stage
        self.pp_has_last_stage = pp_has_last_stage

    def post_dataloading_process(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                                 model_parts) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        """GPT-2 attends causally with SDPA: no attention masks to build."""
        del model_parts
        return input_dict["input"], labels, {k: v for k, v in input_dict.items() if k != "input"}, {}


def build_packed_validator(**kwargs) -> PackedValidator:
    return PackedValidator(**kwargs)
