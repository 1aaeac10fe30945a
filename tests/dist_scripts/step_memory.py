"""Run under torchrun (gloo, real tensors): the peak tensor storage of one real training step,
TorchTitan's own ``train_step`` of ``DispersionTrainer`` (the second step, so the optimizer
state exists), as PyTorch's ``FSDPMemTracker`` counts it (``MemTracker`` on one process),
printed by rank 0 as ``PEAK <bytes>``: what ``dispersion-titan plan`` predicts under
``FakeTensorMode``.

    torchrun --nproc_per_node 2 tests/dist_scripts/step_memory.py --job.config_file C.toml [overrides]
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.nn.modules.module import register_module_forward_pre_hook

from dispersion_titan.config.cli import load_toml, with_config_module
from dispersion_titan.job_config.parse import setup_torchtitan, validated_args
from dispersion_titan.trainer.trainer import DispersionTrainer


def main() -> None:
    setup_torchtitan()
    with tempfile.TemporaryDirectory() as dump:
        args = [
            *sys.argv[1:],
            "--checkpoint.no-enable",
            "--validation.no-enable",
            "--metrics.no-enable_tensorboard",
            "--metrics.log_freq",
            "1000000",
            "--job.dump_folder",
            os.path.join(dump, str(os.environ["RANK"])),
        ]
        trainer = DispersionTrainer(validated_args(with_config_module(args, load_toml(args))))
        data = trainer.batch_generator(trainer.dataloader)
        (model,), (optimizer,) = trainer.model_parts, trainer.optimizers.optimizers
        trainer.step = 1
        trainer.train_step(data)
        if isinstance(model, FSDPModule):
            tracker = FSDPMemTracker(model, optimizer)
        else:
            tracker = MemTracker()
            tracker.track_external(model, optimizer)
        # The trackers keep per-module stats of one forward at a time: cleared as each micro-batch's starts.
        hook = register_module_forward_pre_hook(
            lambda module, args: tracker.reset_mod_stats() if module is model else None
        )
        trainer.step = 2
        with tracker:
            trainer.train_step(data)
        hook.remove()
        (peak,) = tracker.get_tracker_snapshot("peak").values()
        if dist.get_rank() == 0:
            print(f"PEAK {peak['Total']}", flush=True)
        trainer.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
