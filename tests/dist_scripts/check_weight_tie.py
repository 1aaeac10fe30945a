"""Run under torchrun: builds GPT-2 on the meta device, parallelises it with the given
FSDP × TP layout, materialises and initialises it as TorchTitan does, then checks that
the LM head and the token embedding are one parameter and that both uses feed its grad.

    torchrun --nproc_per_node 4 tests/dist_scripts/check_weight_tie.py DP TP
"""

from __future__ import annotations

import sys

import gloo_groups
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torchtitan.config import JobConfig
from torchtitan.distributed import ParallelDims

from dispersion_titan.components import titan_compat
from dispersion_titan.models.fsdp import shard_keeping_the_tie
from dispersion_titan.models.gpt2.args import gpt2_flavors
from dispersion_titan.models.gpt2.model import GPT2
from dispersion_titan.models.gpt2.parallelize import apply_tp


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def main(dp: int, tp: int) -> None:
    titan_compat.apply()
    gloo_groups.init()
    dims = ParallelDims(dp_replicate=1, dp_shard=dp, cp=1, tp=tp, pp=1, ep=1, etp=1, world_size=dp * tp)
    job_config = JobConfig()
    job_config.training.mixed_precision_param = "float32"  # reduced in float32 too, its default
    torch.manual_seed(0)
    args = gpt2_flavors["debug"]
    with torch.device("meta"):
        model = GPT2(args)
    if tp > 1:
        apply_tp(model, dims.get_mesh("tp"), loss_parallel=False)
    if dp > 1:  # as the job's parallelize does, resharding after forward
        shard_keeping_the_tie(model, dims, job_config)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights()

    assert model.output.weight is model.tok_embeddings.weight, "tie lost"
    names = [name for name, _ in model.named_parameters()]
    assert "output.weight" not in names and sum("tok_embeddings" in n for n in names) == 1, names

    # The shared parameter's gradient is exactly the embedding's plus the head's, summed
    # over the DP ranks' different batches (TorchTitan normalises the loss itself, so FSDP
    # sums), as computed by an unsharded untied twin holding the same values.
    batches = [
        torch.randint(0, args.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1 + rank))
        for rank in range(dp)
    ]
    logits = model(batches[dist.get_rank() // tp])  # the mesh is (fsdp, tp)
    (logits.full_tensor() if isinstance(logits, DTensor) else logits).logsumexp(-1).sum().backward()
    tied = full(model.tok_embeddings.weight.grad)

    untied_args = gpt2_flavors["debug"]
    untied_args.tie_embeddings = False
    twin = GPT2(untied_args)
    values = {name: full(p.detach()) for name, p in model.named_parameters()}
    twin.load_state_dict({**values, "output.weight": values["tok_embeddings.weight"]})
    for tokens in batches:
        twin(tokens).logsumexp(-1).sum().backward()
    head, embedding = twin.output.weight.grad, twin.tok_embeddings.weight.grad
    assert head.abs().sum() > 0 and embedding.abs().sum() > 0
    torch.testing.assert_close(tied, head + embedding, rtol=1e-5, atol=1e-6)
    if dist.get_rank() == 0:
        print(f"weight tie OK under dp={dp} tp={tp}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
