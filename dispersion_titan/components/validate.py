"""TorchTitan's Validator, fed by the packed held-out split instead of its C4 loader."""

from __future__ import annotations

from typing import Any

import torch
from torchtitan.components.validate import Validator

from ..data.packed import build_packed_validation_dataloader
from .titan_compat import init_validator


class PackedValidator(Validator):
    def __init__(self, job_config, dp_world_size: int, dp_rank: int, **fields: Any) -> None:
        # Validator.__init__ would build TorchTitan's own text loader.
        init_validator(
            self,
            build_packed_validation_dataloader(dp_world_size, dp_rank, job_config),
            job_config=job_config, dp_world_size=dp_world_size, dp_rank=dp_rank,
            **{"pp_schedule": None, "pp_has_first_stage": None, "pp_has_last_stage": None, **fields},
        )

    def post_dataloading_process(self, input_dict: dict[str, torch.Tensor], labels: torch.Tensor,
                                 model_parts) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], dict[str, Any]]:
        """GPT-2 attends causally with SDPA: no attention masks to build."""
        del model_parts
        return input_dict["input"], labels, {k: v for k, v in input_dict.items() if k != "input"}, {}


def build_packed_validator(**kwargs: Any) -> PackedValidator:
    return PackedValidator(**kwargs)
