"""A DTensor or a plain tensor, alike: for the code that runs with and without a device mesh. Here, not beside
the model that uses them too, so that the loss's processes (the training objective) need no TorchTitan."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, distribute_tensor


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (differentiable); a plain tensor as it is."""
    return t.to_local() if isinstance(t, DTensor) else t


def copy_full_into(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy a full-size value into a parameter, only this rank's shard of a DTensor (no communication)."""
    if isinstance(param, DTensor):
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)
