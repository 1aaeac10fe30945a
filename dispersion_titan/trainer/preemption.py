"""Checkpoint and exit at the next step boundary on a signal.

- The *preemption* signal (SIGUSR1 unless ``PREEMPT_SIGNAL`` names another; Slurm sends it before
  the time limit, ``launch/slurm/train.sbatch`` requeues): save a full checkpoint, exit
  ``PREEMPTED_EXIT_CODE``. Ignored without checkpointing.
- An *interrupt* (SIGINT, SIGTERM): save where checkpointing is on, say so in one line, exit 128 +
  the signal. A second SIGINT after ``REPEAT_WINDOW_S`` abandons the save; a repeated SIGTERM is
  ignored (its sender grants a grace period).

Handlers only record the signal; the ranks agree on it in the trainer's all-reduce of its step flags, so
all stop at the same step. They are installed whatever the inherited disposition (a background
job inherits SIGINT ignored). After the last step a signal changes nothing.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch.distributed as dist
from torchtitan.tools.logging import logger

from ..components.titan_compat import save_full_checkpoint
from ..run_folder.checkpoints import last_complete_step
from ..utils.errors import INTERRUPT_SIGNALS, PREEMPTED_EXIT_CODE, interrupted_exit_code, say

SIGNAL_ENV = "PREEMPT_SIGNAL"
DEFAULT_SIGNAL = "USR1"
REPEAT_WINDOW_S = 2.0  # one signal delivered twice (to torchrun and the ranks) is not a second one
SAVED = "interrupted at step {step}; checkpoint step-{step} saved; relaunch the same command to resume"


def parse_signal(name: str) -> signal.Signals:
    """``USR1``, ``SIGUSR1`` or ``10`` -> ``signal.SIGUSR1``; anything else is a ValueError."""
    text = name.strip().upper()
    try:
        return (
            signal.Signals(int(text))
            if text.isdigit()
            else signal.Signals[text if text.startswith("SIG") else "SIG" + text]
        )
    except (KeyError, ValueError):
        raise ValueError(f"{SIGNAL_ENV}: {name!r} is not a signal name such as USR1") from None


_interrupts: list[int] = []  # the SIGINT and SIGTERM this process's handlers saw, in order
PEER_GONE = ("Connection reset by peer", "Connection closed by peer")  # gloo, a peer process gone


def secondary_failure_status(error: BaseException) -> int | None:
    """The exit status for an error that only follows from the job being stopped (another rank
    failed, or a signal), None for any other: the launcher names the rank that failed first."""
    if _interrupts:
        return interrupted_exit_code(_interrupts[0])
    lost = isinstance(error, dist.DistError) or any(text in str(error) for text in PEER_GONE)
    return 1 if lost and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None


class Preemption:
    """Installs the signal handlers in this rank; ``stop`` is collective."""

    def __init__(self) -> None:
        self.signum = parse_signal(os.environ.get(SIGNAL_ENV, DEFAULT_SIGNAL))
        self.received: signal.Signals | None = None
        self._received_at = 0.0
        self._saving: tuple[int, str] | None = None  # (step, checkpoint folder) while an interrupt saves
        for signum in {self.signum, *INTERRUPT_SIGNALS}:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        # Only a flag: the training step in progress must finish first.
        if signum in INTERRUPT_SIGNALS:
            _interrupts.append(signum)
        now = time.monotonic()
        if self.received is None:
            self.received, self._received_at = signal.Signals(signum), now
        elif signum == signal.SIGINT and now - self._received_at >= REPEAT_WINDOW_S:
            self._abandon(signum)

    def _abandon(self, signum: int) -> None:
        """A second Ctrl-C: leave now; an incomplete save is moved aside by the next launch."""
        if self._saving is None:
            say(
                "interrupted again before the checkpoint was saved; nothing saved; "
                "relaunch the same command to resume from the last checkpoint"
            )
        else:
            step, folder = self._saving
            last = last_complete_step(folder)
            if last == step:
                say(SAVED.format(step=step))
            else:
                previous = f"step-{last}" if last is not None else "none"
                say(
                    f"interrupted again while saving step-{step}: the save was abandoned, the last good checkpoint "
                    f"is {previous}; relaunch the same command to resume"
                )
        os._exit(interrupted_exit_code(signum))

    def stop(self, trainer: Any, signum: int) -> None:
        """Once the ranks agreed some rank received ``signum``, after a step: save it and exit."""
        step, steps = trainer.step, trainer.job_config.training.steps
        if step >= steps:
            return  # the last step: the normal end, and its final save, follow
        sig = signal.Signals(signum)
        ckpt, folder = trainer.checkpointer, trainer.checkpoint_folder
        if sig == self.signum:
            if folder is None:
                logger.warning(f"{sig.name} received, but checkpointing is disabled: training goes on")
                self.received = None
                return
            logger.warning(f"{sig.name} received: saving a full checkpoint of step {step}")
            save_full_checkpoint(ckpt, step)
            logger.warning(f"Stopping at step {step} for a restart; exit status {PREEMPTED_EXIT_CODE}")
            self._exit(trainer, PREEMPTED_EXIT_CODE, None)
        if folder is None:
            self._exit(
                trainer, interrupted_exit_code(sig), f"interrupted at step {step}; checkpointing is off, nothing saved"
            )
        self._saving = (step, folder)
        save_full_checkpoint(ckpt, step)
        self._saving = None
        self._exit(trainer, interrupted_exit_code(sig), SAVED.format(step=step))

    @staticmethod
    def _exit(trainer: Any, status: int, message: str | None) -> None:
        trainer.close()  # flush metrics (TensorBoard) and stop the checkpoint helpers
        dist.barrier()  # torchrun stops the others as soon as one rank exits with an error status
        dist.destroy_process_group()
        if message is not None:
            say(message)
        raise SystemExit(status)
