"""Under sequence parallelism a TP rank holds a slice of every sequence, but a pairwise loss needs
whole ones: one all-to-all hands each rank whole sequences of its own share, whose partial sums add
up to the whole (no TP-fold recomputation).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single


def shares(batch: int, world: int) -> list[int]:
    """Sequences owned by each TP rank: contiguous blocks, the first ``batch % world`` one more."""
    return [batch // world + (r < batch % world) for r in range(world)]


def own_sequences(local: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Whole sequences [b_r, N, d] of this TP rank's share of [B, N/tp, d] (unchanged without TP);
    the backward (torch's, of the all-to-all) sends each slice's gradient back to the rank that holds it."""
    if group is None:
        return local
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    slice_len, rest = local.shape[1], local.shape[2:]
    splits = shares(local.shape[0], world)
    owned = splits[rank]
    # Row block s of the result holds source rank s's slice of the owned sequences.
    received = all_to_all_single(
        local.new_empty((owned * world, *local.shape[1:])), local.contiguous(), [owned] * world, splits, group
    )
    return received.view(world, owned, slice_len, *rest).transpose(0, 1).reshape(owned, world * slice_len, *rest)
