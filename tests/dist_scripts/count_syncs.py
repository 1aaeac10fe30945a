"""Run under torchrun: count, per training step, the collectives and host reads of one
trainer class on the debug model, and write them (rank 0) as JSON {step: [collectives,
host_reads, ours]}, ``ours`` the reads made in our package (where each was made, its innermost
frame of ``dispersion_titan`` or TorchTitan being ours). ``stock`` is TorchTitan's own Trainer,
``dispersion`` ours.

    torchrun --nproc_per_node 2 tests/dist_scripts/count_syncs.py stock|dispersion OUT.json TRAINING_ARGS...
"""

from __future__ import annotations

import json
import os
import re
import sys

import torch
import torchtitan
from torch.utils._python_dispatch import TorchDispatchMode

import dispersion_titan

COLLECTIVE = re.compile(r"^_?c10d(_functional)?\.(?!wait_tensor|_wrap_tensor_autograd)")
# ``.item()`` and friends; ``bool(t)`` under inference mode (as ``ReadBacks`` in test_analysis.py)
READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default)
OURS, TITANS = (os.path.dirname(package.__file__) + os.sep for package in (dispersion_titan, torchtitan))


def our_site() -> str | None:
    """``file:line`` of the innermost frame of ours or TorchTitan's, where it is ours."""
    frame = sys._getframe(1)
    while frame is not None and not frame.f_code.co_filename.startswith((OURS, TITANS)):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(OURS):
        return None
    return f"{os.path.relpath(frame.f_code.co_filename, os.path.dirname(OURS))}:{frame.f_lineno}"


class Counter(TorchDispatchMode):
    """Collectives (every c10d op but waits) and host reads, ours with where they were made."""

    def __init__(self) -> None:
        super().__init__()
        self.collectives = self.host_reads = 0
        self.ours: list[str] = []

    def read(self) -> None:
        self.host_reads += 1
        if (site := our_site()) is not None:
            self.ours.append(site)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if COLLECTIVE.match(str(func)):
            self.collectives += 1
        elif func in READS:
            self.read()
        return func(*args, **(kwargs or {}))


def main(kind: str, out: str, args: list[str]) -> None:
    from dispersion_titan.config.cli import load_toml, with_config_module
    from dispersion_titan.job_config.parse import setup_torchtitan, validated_args

    args = with_config_module(args, load_toml(args))
    setup_torchtitan()
    from torchtitan.train import Trainer

    from dispersion_titan.trainer.trainer import DispersionTrainer

    base = DispersionTrainer if kind == "dispersion" else Trainer
    counts: dict[int, list] = {}
    tolist = torch.Tensor.tolist

    class Counting(base):
        def train_step(self, data_iterator) -> None:
            with Counter() as counter:

                def counted_tolist(t: torch.Tensor):  # reads the tensor without _local_scalar_dense
                    counter.read()
                    return tolist(t)

                torch.Tensor.tolist = counted_tolist
                try:
                    super().train_step(data_iterator)
                finally:
                    torch.Tensor.tolist = tolist
            counts[self.step] = [counter.collectives, counter.host_reads, counter.ours]

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
