"""Checkpoint and exit on a signal: what a job does when Slurm warns it of its time limit.

``launch/slurm/train.sbatch`` asks Slurm for SIGUSR1 a few minutes before the limit
(``#SBATCH --signal=B:USR1@300``), forwards it to the training ranks, and requeues the
job when training then ends with an error status. Here, each rank only records the
signal in a flag. The ranks agree on it at every log step and before every checkpoint
save, in the one small device all-reduce that also carries the non-finite-loss flag
(``trainer.StepHealth``: a signal seen by some ranks stops all of them at the same
step); once set, they save a full checkpoint of that step (model, optimizer, scheduler,
data loader, train state) and exit with ``PREEMPTED_EXIT_CODE``. The requeued job keeps its job id, hence its dump folder,
and TorchTitan resumes from that checkpoint.

The signal is SIGUSR1 unless ``PREEMPT_SIGNAL`` names another (``USR2``, ``SIGTERM``...).
A signal that arrives when training has already done its last step changes nothing:
the run ends normally, with status 0.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch.distributed as dist
from torchtitan.tools.logging import logger

from ..components.titan_compat import checkpointer_folder, save_full_checkpoint

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL of sysexits.h: "temporary failure, try again"
SIGNAL_ENV = "PREEMPT_SIGNAL"
DEFAULT_SIGNAL = "USR1"


def parse_signal(name: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1`` or ``10`` -> ``signal.SIGUSR1``; anything else is a ValueError."""
    text = name.strip().upper()
    try:
        return signal.Signals(int(text)) if text.isdigit() else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise ValueError(f"{SIGNAL_ENV}: {name!r} is not a signal name such as USR1") from None


class Preemption:
    """Installs the signal handler in this rank; ``stop`` is collective."""

    def __init__(self, signal_name: str | None = None) -> None:
        self.signum = parse_signal(signal_name or os.environ.get(SIGNAL_ENV, DEFAULT_SIGNAL))
        self.requested = False
        signal.signal(self.signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.requested = True  # only a flag: the training step in progress must finish first

    def stop(self, trainer: Any) -> None:
        """Once the ranks agreed that some rank was signalled, after a training step: save
        this step and exit the process (every rank calls it at the same step).

        Called where TorchTitan saves its interval checkpoints (after the optimizer
        step, before validation).
        """
        step, steps = trainer.step, trainer.job_config.training.steps
        if step >= steps:
            return  # the last step: the normal end, and its final save, follow
        ckpt = trainer.checkpointer
        if checkpointer_folder(ckpt) is None:
            if self.requested:
                logger.warning(f"{self.signum.name} received, but checkpointing is disabled: training goes on")
            self.requested = False
            return
        logger.warning(f"{self.signum.name} received: saving a full checkpoint of step {step}")
        save_full_checkpoint(ckpt, step)
        logger.warning(f"Stopping at step {step} for a restart; exit status {PREEMPTED_EXIT_CODE}")
        trainer.close()  # flush metrics (TensorBoard) and stop the checkpoint helpers
        # No rank leaves before all have saved and flushed: torchrun stops the others as
        # soon as one rank exits with an error status.
        dist.barrier()
        dist.destroy_process_group()
        raise SystemExit(PREEMPTED_EXIT_CODE)
