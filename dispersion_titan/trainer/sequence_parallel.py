"""Under sequence parallelism a TP rank holds a slice of every sequence, but a pairwise loss needs
whole ones: one all-to-all hands each rank whole sequences of its own share, whose partial sums add
up to the whole (no TP-fold recomputation).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def shares(batch: int, world: int) -> list[int]:
    """Sequences owned by each TP rank: contiguous blocks, the first ``batch % world`` one more."""
    return [batch // world + (r < batch % world) for r in range(world)]


def _all_to_all(
    x: torch.Tensor, out_rows: int, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    out = x.new_empty((out_rows, *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


class _OwnSequences(torch.autograd.Function):
    """[B, N/tp, d] token slices of every sequence -> [b_r, N, d] whole sequences of this
    rank's share; backward sends each slice's gradient back to the rank that holds it."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        batch, slice_len = local.shape[0], local.shape[1]
        ctx.group, ctx.splits = group, shares(batch, world)
        ctx.owned = owned = ctx.splits[rank]
        # Row block s of the result holds source rank s's slice of the owned sequences.
        received = _all_to_all(local, owned * world, [owned] * world, ctx.splits, group)
        received = received.view(world, owned, slice_len, *local.shape[2:]).transpose(0, 1)
        return received.reshape(owned, world * slice_len, *local.shape[2:])

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        world = len(ctx.splits)
        slice_len = grad.shape[1] // world
        by_source = grad.reshape(ctx.owned, world, slice_len, *grad.shape[2:]).transpose(0, 1)
        back = _all_to_all(
            by_source.reshape(ctx.owned * world, slice_len, *grad.shape[2:]),
            sum(ctx.splits),
            ctx.splits,
            [ctx.owned] * world,
            ctx.group,
        )
        return back, None


def own_sequences(local: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Whole sequences [b_r, N, d] of this TP rank's share of [B, N/tp, d] (unchanged without TP)."""
    if group is None:
        return local
    return _OwnSequences.apply(local, group)
