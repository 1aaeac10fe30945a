"""Run under torchrun with 2 or 3 processes (the TP group is the world): the dispersion
loss split over TP ranks by ``own_sequences`` has the value and the input gradient of
the loss computed whole in one process, for batches smaller than, equal to and not a
multiple of the TP degree.

    torchrun --nproc_per_node 2 tests/dist_scripts/check_sequence_split.py
"""

from __future__ import annotations

import gloo_groups
import torch
import torch.distributed as dist

from dispersion_titan.losses import dispersion_loss
from dispersion_titan.trainer.objective import own_sequences, shares

SLICE, DIM = 3, 5


def main() -> None:
    gloo_groups.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.new_group(list(range(world)), timeout=gloo_groups.TIMEOUT)
    for batch in (1, world, world + 1, 2 * world + 1):
        full = torch.randn(
            batch, SLICE * world, DIM, generator=torch.Generator().manual_seed(batch), requires_grad=True
        )
        dispersion_loss(full, "angular_spread", tau=0.5).backward()

        local = full.detach()[:, rank * SLICE : (rank + 1) * SLICE].clone().requires_grad_()
        owned = own_sequences(local, group)
        first = sum(shares(batch, world)[:rank])
        assert torch.equal(owned.detach(), full.detach()[first : first + owned.shape[0]]), (batch, rank)
        if owned.shape[0]:
            part = dispersion_loss(owned, "angular_spread", tau=0.5) * owned.shape[0] / batch
        else:
            part = owned.sum().float()  # the loss is fp32 whatever the input dtype
        part.backward()
        value = part.detach().clone()
        dist.all_reduce(value, group=group)
        torch.testing.assert_close(
            value, dispersion_loss(full.detach(), "angular_spread", tau=0.5), rtol=1e-6, atol=1e-7
        )
        torch.testing.assert_close(local.grad, full.grad[:, rank * SLICE : (rank + 1) * SLICE], rtol=1e-5, atol=1e-7)
    if rank == 0:
        print(f"sequence split OK on {world} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
