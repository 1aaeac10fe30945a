"""Every place dispersion_titan relies on TorchTitan 0.2.2 internals, in one module.

Nothing else imports a private TorchTitan name or depends on how TorchTitan's code is written
inside. Each function says what it relies on, and ``tests/test_titan_compat.py`` has a canary per
touch that fails, naming it, when an upgrade changes that.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import resource
import types
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torchtitan.config import ConfigManager
from torchtitan.train import Trainer  # free here: torchtitan.config and the models import it already

TORCHTITAN_VERSION = "0.2.2"


def check_torchtitan_version() -> None:
    """Fail loudly if the TorchTitan underneath is not the one this module was written for."""
    found = version("torchtitan")
    if found != TORCHTITAN_VERSION:
        raise RuntimeError(
            f"dispersion_titan requires torchtitan=={TORCHTITAN_VERSION}, found {found}; "
            "its internals touched in dispersion_titan/components/titan_compat.py must be re-checked"
        )


# ------------------------------------------------------------------------ configuration


class _MergedOnce(ConfigManager):
    """TorchTitan's ``ConfigManager`` whose ``_merge_configs`` makes one class per process (it makes a
    new one at every parse), named a built-in: tyro looks for each field's docstring in its class's source,
    and for a made class ``inspect`` parsed all of its module ``types``'s source, once per section at every
    parse (tyro clears its caches at every parse): 0.09 s of CPU a parse; a built-in has no source to read."""

    @staticmethod
    @functools.cache
    def _merge_configs(base: type, custom: type) -> type:
        merged = ConfigManager._merge_configs(base, custom)
        merged.__module__ = "builtins"
        return merged


def config_manager_parse(args: list[str], toml: dict) -> Any:
    """``ConfigManager().parse_args(args)`` on ``toml`` already read, so our checks and TorchTitan's
    parse see the same bytes: ``parse_args`` reads the TOML only through ``_maybe_load_toml``."""

    class ReadOnce(_MergedOnce):
        def _maybe_load_toml(self, args: list[str]) -> dict | None:
            return toml or None

    return ReadOnce().parse_args(args)


def merged_job_config_class(custom_module: str) -> type:
    """TorchTitan's JobConfig class merged with ``custom_module``'s sections, the very class ``parse_args``
    builds (its ``_maybe_add_custom_config``), for type checks before the real parse: without a parse by
    tyro, which costs every process that checks a config 0.1 to 0.15 s of CPU."""
    return _MergedOnce()._maybe_add_custom_config(["--job.custom_config_module", custom_module], None)


# ------------------------------------------------------------------------ CPU devices

# Modules that bind ``device_type``/``device_module`` by name at import time.
MODULES_BINDING_DEVICE = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiling",
)


def _cpu_memory_stats(device: object = None) -> dict[str, int]:
    """Peak resident set size of this process, reported like the CUDA allocator's stats."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "active_bytes.all.peak": peak,
        "reserved_bytes.all.peak": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def _cpu_device_module() -> types.SimpleNamespace:
    """``torch.cpu`` plus the CUDA-module functions TorchTitan calls on its device module."""
    return types.SimpleNamespace(
        set_device=lambda device: None,
        current_device=lambda: 0,
        synchronize=torch.cpu.synchronize,
        get_device_name=lambda device=None: f"CPU ({platform.processor() or platform.machine()})",
        get_device_properties=lambda device=None: types.SimpleNamespace(
            total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        ),
        memory_stats=_cpu_memory_stats,
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None,
        memory=types.SimpleNamespace(_record_memory_history=lambda *a, **k: None, _snapshot=lambda: {}),
    )


def uses_cpu() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Check the version and, without a GPU, point TorchTitan at the CPU: the module-level
    ``device_type`` / ``device_module`` bindings assume CUDA. Idempotent (the same bindings
    again); on CUDA nothing changes."""
    check_torchtitan_version()
    if not uses_cpu():
        return
    import importlib

    cpu_module = _cpu_device_module()
    for name in MODULES_BINDING_DEVICE:
        module = importlib.import_module(name)
        module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu_module


# ------------------------------------------------------------------------ data parallelism


class WithoutDataParallel:
    """``parallel_dims`` under which TorchTitan's parallelize functions, which apply FSDP exactly when
    ``fsdp_enabled`` and DDP when ``dp_replicate_enabled``, apply neither (their FSDP shards a tied
    Qwen3's embeddings and head apart): the caller applies its own."""

    fsdp_enabled = False
    dp_replicate_enabled = False

    def __init__(self, parallel_dims: Any) -> None:
        self._parallel_dims = parallel_dims

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parallel_dims, name)


def attention_on_local_shards(model: torch.nn.Module) -> None:
    """Run the SDPA of TorchTitan's ``ScaledDotProductAttentionWrapper`` (q, k, v positional, DTensors
    sharded by heads under TP) on each rank's own heads as plain tensors, and hand the result on as
    the DTensor it would have been: on a CPU DTensor cannot run SDPA. Heads are independent, so the
    local computation is the exact one."""
    from torch.distributed.tensor import DTensor
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    def shard_view(layout: list, module: torch.nn.Module, args: tuple) -> tuple | None:
        if not isinstance(args[0], DTensor):
            return None
        layout.append((args[0].device_mesh, args[0].placements))
        return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

    def as_dtensor(layout: list, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
        return DTensor.from_local(output, *layout.pop(), run_check=False) if layout else None

    for module in model.modules():
        if isinstance(module, ScaledDotProductAttentionWrapper):
            layout: list = []
            module.register_forward_pre_hook(functools.partial(shard_view, layout))
            module.register_forward_hook(functools.partial(as_dtensor, layout))


# ------------------------------------------------------------------------ validation


def init_validator(validator: Any, **fields: Any) -> None:
    """What ``Validator.__init__`` does (it sets a field of each parameter the trainer hands it, but the two its C4
    text loader takes, and ``validation_dataloader``: its canary checks), with our data loader instead of that one.
    ``PackedValidator`` relies on ``Validator.validate`` calling ``model_parts[0](inputs, **extra)`` then
    ``self.loss_fn(predictions, labels)`` in its contexts."""
    for name, value in fields.items():
        setattr(validator, name, value)


def wandb_logs_from(metric_logger: Any, first: int) -> None:
    """TorchTitan's W&B logger within ``metric_logger`` (``MetricsProcessor.logger``: a ``LoggerContainer``, its
    loggers in ``_loggers``) passes over steps below ``first``; TensorBoard's beside it still logs them."""
    from torchtitan.components.metrics import LoggerContainer, WandBLogger

    for each in metric_logger._loggers if isinstance(metric_logger, LoggerContainer) else ():
        if isinstance(each, WandBLogger):
            log = each.log
            each.log = lambda metrics, step: None if step < first else log(metrics, step)


def model_converter_names() -> set[str]:
    """The names ``model.converters`` may hold: the keys of the private registry
    ``ModelConvertersContainer`` looks each up in."""
    from torchtitan.protocols import model_converter

    return set(model_converter._registry_model_converter_cls)


# ------------------------------------------------------------------------ checkpointing


def checkpointer_folder(checkpointer: Any) -> str | None:
    """The checkpoint folder, or None when disabled (a disabled checkpointer has no ``folder``)."""
    return checkpointer.folder if checkpointer.enable else None


def will_save(checkpointer: Any, step: int, last_step: bool) -> bool:
    """Whether ``checkpointer.save(step, last_step)`` will write: its private ``_should_save`` rule."""
    return checkpointer._should_save(step, last_step=last_step)


def save_full_checkpoint(checkpointer: Any, step: int) -> None:
    """Save every state of ``step`` now, synchronously, whatever the interval: the checkpointer's
    last-step path (which waits for an asynchronous save in flight), with the full state instead of
    the weights-only export ``last_save_model_only`` / ``last_save_in_hf`` would make."""
    saved = checkpointer.last_save_model_only, checkpointer.last_save_in_hf
    checkpointer.last_save_model_only = checkpointer.last_save_in_hf = False
    try:
        checkpointer.save(curr_step=step, last_step=True)
    finally:
        checkpointer.last_save_model_only, checkpointer.last_save_in_hf = saved


def on_save_error(
    checkpointer: Any, handler: Callable[[int, BaseException], None], returned: Callable[[int], None]
) -> None:
    """Call ``handler(step, error)`` when a save fails, before the error goes on (the handler may
    raise another instead), and ``returned(step)`` after each call that did not (most save nothing: not
    a save step). Every save TorchTitan makes goes through this instance's ``save``, wrapped here; a
    synchronous write raises there."""
    from torch.distributed.checkpoint.api import CheckpointException  # DCP's, a BaseException

    save = checkpointer.save

    @functools.wraps(save)
    def save_or_report(curr_step: int, *args: Any, **kwargs: Any) -> Any:
        try:
            result = save(curr_step, *args, **kwargs)
        except (Exception, CheckpointException) as e:
            handler(curr_step, e)
            raise
        returned(curr_step)
        return result

    checkpointer.save = save_or_report


# ------------------------------------------------------------------------ optimizers and LR schedules


def optimizer_per_model_part(optimizers: Any) -> list[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """Each model part with its torch optimizer (``OptimizersContainer``: one per part, one param group)."""
    return list(zip(optimizers.model_parts, optimizers.optimizers, strict=True))


def lr_lambda(lr_scheduler_config: Any, training_steps: int) -> Callable[[int], float]:
    """TorchTitan's warm-up / stable / decay factor: the one ``lr_lambda`` ``build_lr_schedulers`` gives
    every ``LambdaLR`` (built here on a probe optimizer)."""
    from torchtitan.components.lr_scheduler import build_lr_schedulers

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    (scheduler,) = build_lr_schedulers([probe], lr_scheduler_config, training_steps).schedulers
    return scheduler.lr_lambdas[0]


def lr_schedulers_per_group(optimizers: Any, lr_lambdas: list[Callable[[int], float]]) -> Any:
    """TorchTitan's ``LRSchedulersContainer``, which hands ``lr_lambdas`` (one per param group) to
    ``LambdaLR`` unchanged."""
    from torchtitan.components.lr_scheduler import LRSchedulersContainer

    return LRSchedulersContainer(optimizers, lr_lambdas)


# ------------------------------------------------------------------------ the trainer


class TrainerHooks(Trainer):
    """TorchTitan's Trainer with the two hooks ``DispersionTrainer`` needs."""

    _loaded = False

    def on_checkpoint_loaded(self) -> None:
        """Runs once, after ``train()`` has loaded (or not found) a checkpoint and before step 1."""

    def should_continue_training(self) -> bool:
        # ``train()`` calls this right after ``checkpointer.load`` and then once per step.
        if not self._loaded:
            self._loaded = True
            self.on_checkpoint_loaded()
        return super().should_continue_training()

    def forward_backward_step(
        self, *, input_dict: dict[str, torch.Tensor], labels: torch.Tensor, global_valid_tokens: torch.Tensor
    ) -> torch.Tensor:
        """TorchTitan's non-pipelined ``forward_backward_step`` (pipeline parallelism is refused at launch),
        with the model call, loss and backward handed to the subclass's ``model_forward_backward(model,
        inputs, labels, global_valid_tokens, model_kwargs)``, which returns the detached loss to log."""
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels)
        (model,) = self.model_parts
        with self.train_context():
            return self.model_forward_backward(
                model, inputs, labels, global_valid_tokens, {**extra_inputs, **extra_kwargs}
            )


# ------------------------------------------------------------------------ plan's fake world


class QuickInit(TorchDispatchMode):
    """``normal_`` drawn uniform with the same mean and std (within ±1.8 std), and a value no fake tensor
    holds read as 0: ``trunc_normal_``'s resampling loop ends at once, which for TorchTitan's LM head
    (±3 std) takes seconds a 100M weights on a CPU, and under ``FakeTensorMode`` cannot read its values.
    For plan, whose trainers read shapes and scales, not the weights' values."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.normal_.default:
            return _uniform_like_normal(*args, **(kwargs or {}))
        try:
            return func(*args, **(kwargs or {}))
        except DataDependentOutputException:
            return 0


def _uniform_like_normal(
    tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, *, generator: torch.Generator | None = None
) -> torch.Tensor:
    half = 3.0**0.5 * std
    return tensor.uniform_(mean - half, mean + half, generator=generator)


@functools.cache
def stand_in_family(name: str) -> str:
    """A TrainSpec of our own, ``name``'s initialised quickly (``QuickInit``), for plan's trainers: a dry
    run's, or one under ``FakeTensorMode`` (the model built and parallelized outside the mode, as ``to_empty``
    refuses fake meta parameters and FSDP2's meshes read values back). Relies on ``Trainer.__init__``
    building ``model_cls(model_args)`` on meta, ``parallelize_fn``, ``to_empty`` then ``init_weights``."""
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    spec = get_train_spec(name)

    def model_cls(model_args: Any) -> torch.nn.Module:
        with unset_fake_temporarily():
            model = spec.model_cls(model_args)
        init_weights = model.init_weights

        def stand_in_init(*args: Any, **kwargs: Any) -> None:
            with QuickInit():
                init_weights(*args, **kwargs)

        model.init_weights = stand_in_init
        return model

    fake = f"{name}.fake_world"
    parallelize_fn = unset_fake_temporarily()(spec.parallelize_fn)  # the context manager as a decorator
    register_train_spec(fake, dataclasses.replace(spec, model_cls=model_cls, parallelize_fn=parallelize_fn))
    return fake


def optimizer_step(trainer: Trainer, batches: list, after_each: Callable[[], None] = lambda: None) -> None:
    """One optimizer step as ``Trainer.train_step`` takes it on ``batches``, less logging and the LR
    schedule: gradients cleared, each micro-batch's ``forward_backward_step`` (then ``after_each``),
    clipping, the optimizers stepped. The token count is the global batch's as ``Trainer.__init__`` resolves
    it (``global_batch_size = -1``: the local batch × the DP ranks); an all-reduce would read a fake value."""
    from torchtitan.distributed import utils as dist_utils

    t, pd = trainer.job_config.training, trainer.parallel_dims
    device = trainer.device if trainer.device.type != "cpu" else torch.device("cpu")  # a fake "cpu:0" is not "cpu"
    sequences = trainer.gradient_accumulation_steps * t.local_batch_size * pd.dp_replicate * pd.dp_shard
    tokens = torch.tensor(float(sequences * t.seq_len), device=device)
    trainer.optimizers.zero_grad()
    for input_dict, labels in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()}
        trainer.forward_backward_step(input_dict=inputs, labels=labels.to(device), global_valid_tokens=tokens)
        after_each()
    dist_utils.clip_grad_norm_([p for m in trainer.model_parts for p in m.parameters()], t.max_norm, foreach=True)
    trainer.optimizers.step()
