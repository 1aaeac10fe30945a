"""Packed data loaders as TorchTitan's trainer iterates them (data tests)."""

from __future__ import annotations

import torch
from torchtitan.components.dataloader import ParallelAwareDataloader


def loader(dataset, rank: int, world: int) -> ParallelAwareDataloader:
    return ParallelAwareDataloader(dataset, dp_rank=rank, dp_world_size=world, batch_size=dataset.local_batch_size)


def global_batches(make, world: int, accum: int, local: int, steps: int) -> list[torch.Tensor]:
    """What each optimizer step trains on: every rank's micro-batches, in sequence order."""
    iters = [iter(loader(make(local, r, world), r, world)) for r in range(world)]
    out = []
    for _ in range(steps):
        micro = [[next(it)[0]["input"] for it in iters] for _ in range(accum)]
        out.append(torch.cat([b for m in micro for b in m]))
    return out


def resumed_equals_uninterrupted(make, world: int, stop: int, more: int) -> None:
    for rank in range(world):
        uninterrupted = iter(loader(make(2, rank, world), rank, world))
        expected = [next(uninterrupted) for _ in range(stop + more)][stop:]
        first = loader(make(2, rank, world), rank, world)
        it = iter(first)
        for _ in range(stop):
            next(it)
        state = first.state_dict()
        resumed = loader(make(2, rank, world), rank, world)
        resumed.load_state_dict(state)
        for (x, y), (ex, ey) in zip(resumed, expected, strict=False):  # resumed never ends
            assert torch.equal(x["input"], ex["input"]) and torch.equal(y, ey)
