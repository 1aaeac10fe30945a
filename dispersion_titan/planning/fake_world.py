"""``DispersionTrainer`` in this process as rank 0 of an N-rank job (TorchTitan's ``fake_backend``:
collectives move nothing), for ``plan``. The checked config less what needs the run's files or a
GPU; the process's state is restored on exit (``_process_state``).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
import signal
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING
from unittest import mock

import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torchtitan.tools.logging import logger

from ..components.titan_compat import stand_in_family
from ..tokenizer.encoders import tokenizer_folder
from ..trainer.preemption import DEFAULT_SIGNAL, SIGNAL_ENV, parse_signal
from ..trainer.trainer import DispersionTrainer
from ..utils.errors import INTERRUPT_SIGNALS

if TYPE_CHECKING:
    from ..config.schema import RunConfig


class _RankZero(DispersionTrainer):
    def init_distributed(self):
        """Meshes built with real tensors: ``DeviceMesh`` reads values back."""
        with unset_fake_temporarily():
            parallel_dims = super().init_distributed()
            parallel_dims.build_mesh()
        return parallel_dims


@contextlib.contextmanager
def _process_state(world: int) -> Iterator[dict[int, object]]:
    """Rank 0's environment, TorchTitan's log lines and PyTorch's warnings unsaid; yields the signal handlers as
    they were. On exit the environment, log level, signal handlers, exception hook and garbage collector as they
    were (the trainer installs its own)."""
    names = {"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1"}
    # DTensor's advice on redistributing over an FSDP × TP mesh (its gradient norm) is for PyTorch, not the user
    loggers = {log: log.level for log in (logger, logging.getLogger("torch.distributed.tensor"))}
    signals = {signal.SIGINT, signal.SIGTERM, parse_signal(os.environ.get(SIGNAL_ENV, DEFAULT_SIGNAL))}
    saved_handlers = {s: signal.getsignal(s) for s in signals}
    collecting, excepthook = gc.isenabled(), sys.excepthook
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with mock.patch.dict(os.environ, names), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield saved_handlers
    finally:
        for log, level in loggers.items():
            log.setLevel(level)
        for s, handler in saved_handlers.items():
            signal.signal(s, handler)
        sys.excepthook = excepthook
        if collecting:
            gc.enable()


def _interrupts_to_the_command(trainer: DispersionTrainer, handlers: dict[int, object]) -> None:
    """The trainer's handlers only flag SIGINT and SIGTERM for a training loop, which this trainer never runs: a
    Ctrl-C during plan's measurement was ignored, the plan printed, exit 0. The command's handlers again, and a
    signal the trainer flagged while it was built ends the command now, as they would have."""
    for signum in INTERRUPT_SIGNALS:
        if handlers[signum] is not None:  # None: not set from Python
            signal.signal(signum, handlers[signum])
    received = trainer.preemption.received
    if received in INTERRUPT_SIGNALS:
        raise KeyboardInterrupt(int(received))


@contextlib.contextmanager
def rank_zero_trainer(
    job_config: RunConfig, world: int, fake: FakeTensorMode | None = None
) -> Iterator[DispersionTrainer]:
    """``DispersionTrainer`` as rank 0 of ``world`` ranks, quiet, built under ``fake`` when given (the model
    family's stand-in for it), else its weights drawn uniform with the init's mean and std (a dry run reads
    none of their values; ``trunc_normal_`` resamples for seconds on a CPU), closed on exit. Its config:
    ``job_config`` with no checkpoints, validation, loggers or compile; the embedded ``enwiki_sample`` (token
    values change neither layout nor memory); a temporary run folder."""
    c = copy.deepcopy(job_config)
    c.comm.mode = "fake_backend"
    c.checkpoint.enable = c.validation.enable = c.compile.enable = False
    c.dispersion.kernel = "torch"  # no Triton probe on fake tensors; plan prices the kernels (step_measure)
    c.metrics.enable_tensorboard = c.metrics.enable_wandb = False
    c.metrics.log_freq = 10**9  # never a log step
    c.training.dataset, c.training.dataset_path = "enwiki_sample", None
    folder = os.path.expanduser(tokenizer_folder(c.model.name, c.model.hf_assets_path) or "")
    c.model.hf_assets_path = folder if os.path.isdir(folder) else ""
    c.model.name = stand_in_family(c.model.name)
    with _process_state(world) as handlers, tempfile.TemporaryDirectory(prefix="plan_") as dump:
        c.job.dump_folder = dump
        trainer = None
        try:
            with fake or contextlib.nullcontext():
                trainer = _RankZero(c)
            _interrupts_to_the_command(trainer, handlers)
            yield trainer
        finally:
            if trainer is not None:
                trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()
