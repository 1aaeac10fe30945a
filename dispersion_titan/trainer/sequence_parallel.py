"""Reassembling sequence-parallel activations for losses over token pairs."""

from __future__ import annotations

import torch
import torch.distributed as dist


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dim; backward keeps this rank's slice of the grad.

    Every tensor-parallel rank computes the same loss on the same gathered tensor, so
    each already holds the full gradient: slicing it (no reduce-scatter) gives exactly
    the gradient of one copy of the loss.
    """

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank = dist.get_rank(group)
        ctx.world = dist.get_world_size(group)
        pieces = [torch.empty_like(local) for _ in range(ctx.world)]
        dist.all_gather(pieces, local.contiguous(), group=group)
        return torch.cat(pieces, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.chunk(ctx.world, dim=1)[ctx.rank].contiguous(), None


def gather_sequence(local: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Full-sequence view [B, N, d] of a sequence-sharded [B, N/tp, d] activation."""
    if group is None:
        return local
    return _GatherSequence.apply(local, group)
