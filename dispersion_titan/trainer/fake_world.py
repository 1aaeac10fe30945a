"""``DispersionTrainer`` built in this one process as rank 0 of an N-rank job, through
TorchTitan's ``--comm.mode fake_backend`` (``NGPU=N``: a fake process group whose collectives
move nothing), for ``plan``: its step measured under ``FakeTensorMode`` (``step_measure``) or run
for real, shrunk (``dry_run``).

The job config is the launch's, as ``job_config.parse`` checked it for N processes, less what
needs the run's own files or a GPU: no checkpoints, validation, TensorBoard, W&B or compile;
the data is the embedded ``enwiki_sample`` (token values change neither the layout nor the
memory) and a Hugging Face tokenizer that is not a local folder gives way to GPT-2's BPE;
the run folder is a temporary one. The process's signal handlers and garbage collector are
left as they were found (the trainer installs its own, TorchTitan disables the collector).
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
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily
from torchtitan.distributed import utils as dist_utils
from torchtitan.protocols.train_spec import get_train_spec
from torchtitan.tools.logging import logger

from ..tokenizer.hf_assets import is_hub_id
from .preemption import DEFAULT_SIGNAL, SIGNAL_ENV, parse_signal
from .trainer import DispersionTrainer

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

STEPS_NEVER_LOGGED = 10**9
STAND_IN_DATASET = "enwiki_sample"  # embedded: no download, no token store


def rank_zero_config(job_config: RunConfig, dump_folder: str) -> RunConfig:
    """A copy of ``job_config`` as rank 0 of a fake world runs it (see the module's docstring)."""
    c = copy.deepcopy(job_config)
    c.comm.mode = "fake_backend"
    c.checkpoint.enable = False
    c.validation.enable = False
    c.compile.enable = False
    c.dispersion.kernel = "torch"  # no Triton probe on fake tensors; plan prices the kernels (step_measure)
    c.metrics.enable_tensorboard = c.metrics.enable_wandb = False
    c.metrics.log_freq = STEPS_NEVER_LOGGED
    c.job.dump_folder = dump_folder
    c.training.dataset, c.training.dataset_path = STAND_IN_DATASET, None
    if is_hub_id(c.model.hf_assets_path) or not os.path.isdir(os.path.expanduser(c.model.hf_assets_path)):
        c.model.hf_assets_path = ""
    return c


def _fake_trunc_normal_(
    tensor: torch.Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``torch.nn.init.trunc_normal_`` without its resampling loop, which reads values back: under
    ``FakeTensorMode`` there are no values, only the shapes and the memory."""
    return tensor.normal_(mean, std, generator=generator).clamp_(a, b)


@contextlib.contextmanager
def _fake_build(fake: FakeTensorMode | None, model_name: str) -> Iterator[None]:
    """Under ``fake``, the model family builds and parallelizes its meta-device model outside it,
    on meta tensors as TorchTitan always does (a fake meta parameter cannot be swapped for its CPU
    one by ``to_empty``: PyTorch refuses tensors with weak references; the device meshes FSDP2
    builds over tensor-parallel ones read values back), and initialises the fake weights without
    reading them back."""
    if fake is None:
        yield
        return
    spec = get_train_spec(model_name)
    saved = spec.model_cls, spec.parallelize_fn, torch.nn.init.trunc_normal_

    def outside(fn):
        def call(*args, **kwargs):
            with unset_fake_temporarily():
                return fn(*args, **kwargs)

        return call

    spec.model_cls, spec.parallelize_fn = outside(saved[0]), outside(saved[1])
    torch.nn.init.trunc_normal_ = _fake_trunc_normal_
    try:
        yield
    finally:
        spec.model_cls, spec.parallelize_fn, torch.nn.init.trunc_normal_ = saved


class _RankZero(DispersionTrainer):
    def init_distributed(self):
        """The fake process group and every mesh built with real tensors: ``DeviceMesh`` reads
        values back, which fake tensors cannot do."""
        with unset_fake_temporarily():
            parallel_dims = super().init_distributed()
            parallel_dims.build_mesh()
        return parallel_dims


@contextlib.contextmanager
def _process_state(world: int) -> Iterator[None]:
    """The environment of rank 0 of ``world`` ranks, restored on exit with the signal handlers,
    the exception hook (each process group's start prefixes it with the rank) and the garbage
    collector."""
    names = {"NGPU": str(world), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1"}
    saved_env = {key: os.environ.get(key) for key in names}
    signals = {signal.SIGINT, signal.SIGTERM, parse_signal(os.environ.get(SIGNAL_ENV, DEFAULT_SIGNAL))}
    saved_handlers = {s: signal.getsignal(s) for s in signals}
    collecting, excepthook = gc.isenabled(), sys.excepthook
    os.environ.update(names)
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for s, handler in saved_handlers.items():
            signal.signal(s, handler)
        sys.excepthook = excepthook
        if collecting:
            gc.enable()


@contextlib.contextmanager
def rank_zero_trainer(
    job_config: RunConfig, world: int, fake: FakeTensorMode | None = None
) -> Iterator[DispersionTrainer]:
    """``DispersionTrainer`` as rank 0 of ``world`` ranks; built under ``fake`` when given (its
    parameters and optimizer state then take no memory). Closed, and the process group
    destroyed, on exit."""
    with _process_state(world), tempfile.TemporaryDirectory(prefix="plan_") as dump:
        config = rank_zero_config(job_config, dump)
        trainer = None
        try:
            with _fake_build(fake, config.model.name), fake or contextlib.nullcontext():
                trainer = _RankZero(config)
            yield trainer
        finally:
            if trainer is not None:
                trainer.close()
            if dist.is_initialized():
                dist.destroy_process_group()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """TorchTitan's log lines and PyTorch's warnings of the trainer built for measuring, unsaid."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def micro_batches(trainer: DispersionTrainer, count: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """The trainer's first ``count`` micro-batches from its own data loader, as real tensors."""
    data = trainer.batch_generator(trainer.dataloader)
    return [next(data) for _ in range(count)]


def optimizer_step(
    trainer: DispersionTrainer,
    batches: list,
    global_valid_tokens: torch.Tensor,
    after_each: Callable[[], None] = lambda: None,
) -> None:
    """One optimizer step as TorchTitan's ``train_step`` takes it, on ``batches`` (its
    micro-batches): gradients cleared, each micro-batch's forward and backward through
    ``forward_backward_step`` (the dispersion term included), the gradients clipped, the
    optimizer stepped. The global token count is given (its all-reduce would read a fake
    value back); logging and the learning-rate schedule are left out. ``after_each`` runs after
    each micro-batch's backward. As ``train_step``, each micro-batch moves to the trainer's device
    first (under ``FakeTensorMode`` on a GPU: a fake CUDA copy)."""
    device = trainer.device if trainer.device.type != "cpu" else torch.device("cpu")  # a fake "cpu:0" is not "cpu"
    trainer.optimizers.zero_grad()
    for input_dict, labels in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()}
        trainer.forward_backward_step(
            input_dict=inputs, labels=labels.to(device), global_valid_tokens=global_valid_tokens.to(device)
        )
        after_each()
    dist_utils.clip_grad_norm_(
        [p for m in trainer.model_parts for p in m.parameters()], trainer.job_config.training.max_norm, foreach=True
    )
    trainer.optimizers.step()
