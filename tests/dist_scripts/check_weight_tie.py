"""Run under torchrun: builds GPT-2 on the meta device, parallelises it with the given
FSDP × TP layout, materialises and initialises it as TorchTitan does, then checks that
the LM head and the token embedding are one parameter and that both uses feed its grad.

    torchrun --nproc_per_node 4 tests/dist_scripts/check_weight_tie.py DP TP
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from dispersion_titan.trainer import titan_compat
from dispersion_titan.models.gpt2.args import gpt2_flavors
from dispersion_titan.models.gpt2.model import GPT2
from dispersion_titan.models.gpt2.parallelize import apply_fsdp, apply_tp


def main(dp: int, tp: int) -> None:
    titan_compat.apply()
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    args = gpt2_flavors["debug"]
    with torch.device("meta"):
        model = GPT2(args)
    if tp > 1:
        apply_tp(model, mesh["tp"], loss_parallel=False)
    if dp > 1:
        apply_fsdp(model, mesh["dp"], torch.float32, torch.float32, cpu_offload=False, reshard_after_forward=True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()

    assert model.output.weight is model.tok_embeddings.weight, "tie lost"
    names = [name for name, _ in model.named_parameters()]
    assert "output.weight" not in names and sum("tok_embeddings" in n for n in names) == 1, names

    # The head's gradient flows into the shared parameter: with the embedding use cut
    # off (its output detached) the shared grad is still non-zero, and with both uses
    # it differs from the head-only grad.
    tokens = torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    grads = []
    for detach_embedding in (True, False):
        model.zero_grad()
        handle = model.tok_embeddings.register_forward_hook(lambda m, i, o: o.detach()) if detach_embedding else None
        logits = model(tokens)
        (logits.full_tensor() if isinstance(logits, DTensor) else logits).logsumexp(-1).sum().backward()
        if handle:
            handle.remove()
        g = model.tok_embeddings.weight.grad
        grads.append((g.full_tensor() if isinstance(g, DTensor) else g).clone())
    head_only, both = grads
    assert head_only.abs().sum() > 0, "head gradient missing from the tied parameter"
    assert not torch.allclose(head_only, both), "embedding gradient missing from the tied parameter"
    if dist.get_rank() == 0:
        print(f"weight tie OK under dp={dp} tp={tp}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
