"""Packed data loaders as TorchTitan's trainer iterates them (data tests)."""

from __future__ import annotations

from itertools import islice

import torch

from dispersion_titan.data.packed import PackedDataloader


def loader(dataset, rank: int, world: int) -> PackedDataloader:
    """The trainer's loader class: its state is the global position, or a streamed corpus's per-rank state."""
    return PackedDataloader(dataset, dp_rank=rank, dp_world_size=world, batch_size=dataset.local_batch_size)


def global_batches(make, world: int, accum: int, local: int, steps: int) -> list[torch.Tensor]:
    """What each optimizer step trains on: every rank's micro-batches, in sequence order."""
    assert steps > 0, "no step to compare"
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
        got = list(islice(resumed, more))  # resumed never ends: the batches the uninterrupted one made
        assert more > 0 and len(got) == len(expected) == more, (rank, len(got), len(expected))
        for step, ((x, y), (ex, ey)) in enumerate(zip(got, expected, strict=True)):
            assert torch.equal(x["input"], ex["input"]) and torch.equal(y, ey), (rank, step)
