"""Run under torchrun: count, per training step, the collectives and host reads of one
trainer class on the debug model, and write them (rank 0) as JSON {step: [collectives,
host_reads]}. ``stock`` is TorchTitan's own Trainer, ``dispersion`` ours.

    torchrun --nproc_per_node 2 tests/dist_scripts/count_syncs.py stock|dispersion OUT.json TRAINING_ARGS...
"""

from __future__ import annotations

import json
import re
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVE = re.compile(r"^_?c10d(_functional)?\.(?!wait_tensor|_wrap_tensor_autograd)")


class Counter(TorchDispatchMode):
    """Collectives (every c10d op but waits) and host reads (``.item()`` and friends)."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives = self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if COLLECTIVE.match(str(func)):
            self.collectives += 1
        elif func is torch.ops.aten._local_scalar_dense.default:
            self.host_reads += 1
        return func(*args, **(kwargs or {}))


def main(kind: str, out: str, args: list[str]) -> None:
    from dispersion_titan.config.cli import load_toml, with_config_module
    from dispersion_titan.job_config.parse import setup_torchtitan, validated_args

    args = with_config_module(args, load_toml(args))
    setup_torchtitan()
    from torchtitan.train import Trainer

    from dispersion_titan.trainer.trainer import DispersionTrainer

    base = DispersionTrainer if kind == "dispersion" else Trainer
    counts: dict[int, list[int]] = {}
    tolist = torch.Tensor.tolist

    class Counting(base):
        def train_step(self, data_iterator) -> None:
            reads = [0]

            def counted_tolist(t: torch.Tensor):  # reads the tensor without _local_scalar_dense
                reads[0] += 1
                return tolist(t)

            torch.Tensor.tolist = counted_tolist
            try:
                with Counter() as counter:
                    super().train_step(data_iterator)
            finally:
                torch.Tensor.tolist = tolist
            counts[self.step] = [counter.collectives, counter.host_reads + reads[0]]

    trainer = Counting(validated_args(args))  # checked: derived batch sizes filled in, as a launch does
    try:
        trainer.train()
    finally:
        trainer.close()
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(counts, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
