"""Every place dispersion_titan relies on TorchTitan 0.2.2 internals, in one module.

Nothing else imports a private TorchTitan name or depends on how TorchTitan's code is
written inside. Each touch below has a canary test (``tests/test_titan_compat.py``)
that fails loudly, naming the touch, when an upgrade changes what it relies on:

- ``config_manager_parse``: ``ConfigManager.parse_args`` reads the TOML through
  ``_maybe_load_toml(args)`` and nowhere else (the one private method overridden: our
  checks and TorchTitan's parse must see the same bytes, read once).
- ``use_cpu``: the module-level ``device_type`` / ``device_module`` bindings and the
  memory monitor's default device, which assume CUDA.
- ``without_data_parallel``: TorchTitan's parallelize functions (qwen3's, llama3's) apply
  FSDP exactly when ``parallel_dims.fsdp_enabled`` and DDP when ``dp_replicate_enabled``;
  it exists because their FSDP shards a tied Qwen3's embeddings and head apart.
- ``attention_on_local_shards``: TorchTitan's ``ScaledDotProductAttentionWrapper`` takes
  q, k, v positionally and returns SDPA's output (the qwen3 and llama3 TP plans make them
  DTensors sharded by heads).
- ``init_validator``: ``Validator.__init__`` builds TorchTitan's own text loader, so
  its fields are set here instead. ``PackedValidator.validate`` (``components/validate.py``)
  relies on ``Validator.validate`` calling ``model_parts[0](inputs, **extra)`` and then
  ``self.loss_fn(predictions, labels)`` (a sum over tokens), both inside its contexts.
- ``save_full_checkpoint``: the checkpointer's last-step save path and its
  ``last_save_model_only`` / ``last_save_in_hf`` attributes.
- ``model_converter_names``: ``ModelConvertersContainer`` looks ``model.converters`` up in the private
  registry ``_registry_model_converter_cls``.
- ``checkpointer_folder``: a disabled checkpointer has no ``folder`` attribute.
- ``will_save``: the checkpointer's private ``_should_save(step, last_step)`` rule.
- ``on_save_error``: every checkpoint TorchTitan writes goes through the checkpointer's
  ``save(curr_step, ...)`` method, and a failed synchronous write raises there.
- ``optimizer_per_model_part``: ``OptimizersContainer`` holds one torch optimizer per
  model part (``model_parts`` / ``optimizers``), each with one param group.
- ``lr_lambda``: ``build_lr_schedulers`` gives every ``LambdaLR`` it builds one shared
  ``lr_lambda``; ``lr_schedulers_per_group``: ``LRSchedulersContainer`` hands its
  ``lr_lambda`` to ``LambdaLR`` unchanged (a list: one factor per param group). Both
  builders are the TrainSpec's, called from ``Trainer.__init__`` with the
  ``[optimizer]`` / ``[lr_scheduler]`` sections (which carry ``[baseline]``, ``config.schema.BuilderInputs``).
- ``TrainerHooks``: ``init_distributed`` hands ``job_config.comm`` to ``dist_utils.init_distributed``,
  which makes the flight recorder's folder only when ``trace_buf_size > 0``; an after-checkpoint-load
  hook (``train()`` loads, then calls ``should_continue_training``), and TorchTitan's non-pipelined
  ``forward_backward_step`` around a ``model_forward_backward`` hook where ``DispersionTrainer`` adds its term.
- ``fake_world_family`` (``plan``'s trainer under ``FakeTensorMode``): ``Trainer.__init__`` looks its TrainSpec
  up by ``model.name``, builds ``model_cls(model_args)`` on the meta device, hands it to ``parallelize_fn``,
  then moves it off the meta device (``to_empty``) and calls its ``init_weights``.
- ``optimizer_step``: ``Trainer.train_step`` clears the gradients, runs ``forward_backward_step`` per
  micro-batch, clips the gradients and steps the optimizers.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import platform
import resource
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr
from importlib.metadata import version
from typing import Any

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
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


def config_manager_parse(args: list[str], toml: dict) -> Any:
    """``ConfigManager().parse_args(args)`` on ``toml``, the file ``--job.config_file`` names,
    already read: the TOML is read once per launch (``ConfigManager._maybe_load_toml``)."""
    from torchtitan.config import ConfigManager

    class ReadOnce(ConfigManager):
        def _maybe_load_toml(self, args: list[str]) -> dict | None:
            return toml or None

    return ReadOnce().parse_args(args)


@functools.cache
def merged_job_config_class(custom_module: str) -> type:
    """TorchTitan's JobConfig class merged with the sections of ``custom_module`` (a
    ``job.custom_config_module``), as its public ``parse_args`` builds it: the type of a
    config parsed from no TOML, for type checks before the real parse."""
    from torchtitan.config import ConfigManager

    with redirect_stderr(io.StringIO()):  # its warning that the default hf_assets_path does not exist
        return type(ConfigManager().parse_args(["--job.custom_config_module", custom_module]))


# ------------------------------------------------------------------------ CPU devices

# Modules that bind ``device_type``/``device_module`` by name at import time.
MODULES_BINDING_DEVICE = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.tools.profiling",
)

_cpu_applied = False


def _total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
        device_count=lambda: 1,
        is_available=lambda: True,
        get_device_name=lambda device=None: f"CPU ({platform.processor() or platform.machine()})",
        get_device_properties=lambda device=None: types.SimpleNamespace(total_memory=_total_memory_bytes()),
        memory_stats=_cpu_memory_stats,
        reset_peak_memory_stats=lambda device=None: None,
        empty_cache=lambda: None,
        memory=types.SimpleNamespace(_record_memory_history=lambda *a, **k: None, _snapshot=lambda: {}),
    )


def uses_cpu() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Check the version and, without a GPU, point TorchTitan at the CPU. Idempotent; run
    before a Trainer is built. On CUDA the device selection is left as TorchTitan made it."""
    global _cpu_applied
    check_torchtitan_version()
    if _cpu_applied or not uses_cpu():
        return
    import importlib

    from torchtitan.components.metrics import DeviceMemoryMonitor

    cpu_module = _cpu_device_module()
    for name in MODULES_BINDING_DEVICE:
        module = importlib.import_module(name)
        module.device_type = "cpu"
        if hasattr(module, "device_module"):
            module.device_module = cpu_module
    # DeviceMemoryMonitor's default argument captured "cuda:0" at import time.
    DeviceMemoryMonitor.__init__.__defaults__ = ("cpu:0",)
    _cpu_applied = True


def backend_needs_sum_reduction() -> bool:
    """gloo has no PREMUL_SUM, which FSDP2 uses for its reduce-scatter."""
    return torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"


# ------------------------------------------------------------------------ data parallelism


class _WithoutDataParallel:
    """``parallel_dims`` as a parallelize function that must apply no data parallelism sees it."""

    fsdp_enabled = False
    dp_replicate_enabled = False

    def __init__(self, parallel_dims: Any) -> None:
        self._parallel_dims = parallel_dims

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parallel_dims, name)


def without_data_parallel(parallel_dims: Any) -> Any:
    """A view of ``parallel_dims`` under which TorchTitan's ``parallelize_qwen3`` /
    ``parallelize_llama`` apply tensor parallelism, activation checkpointing and compile
    but neither FSDP nor DDP, which the caller then applies itself."""
    return _WithoutDataParallel(parallel_dims)


def attention_on_local_shards(model: torch.nn.Module) -> None:
    """Run the SDPA of TorchTitan's attention modules on each rank's own heads, as plain
    tensors, and hand the result on as the DTensor it would have been.

    Their tensor-parallel plan gives SDPA DTensors; on a CPU DTensor has no sharding rule
    for the fused CPU kernel, and the math backend adds a plain causal mask to DTensor
    scores. Attention heads are independent (and grouped key/value heads are sharded
    with their query heads), so the local computation is the exact one.
    """
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

# The attributes ``Validator.__init__`` sets, besides the data loader built from its own
# C4 text loader; ``init_validator`` sets the same ones.
VALIDATOR_FIELDS = (
    "job_config",
    "tokenizer",
    "parallel_dims",
    "loss_fn",
    "validation_dataloader",
    "validation_context",
    "maybe_enable_amp",
    "metrics_processor",
    "pp_schedule",
    "pp_has_first_stage",
    "pp_has_last_stage",
)


def init_validator(validator: Any, validation_dataloader: Any, **fields: Any) -> None:
    """What ``Validator.__init__`` does, with our data loader instead of TorchTitan's."""
    from torchtitan.components.validate import BaseValidator

    BaseValidator.__init__(validator, fields.pop("job_config"))
    fields.pop("dp_world_size")
    fields.pop("dp_rank")
    expected = set(VALIDATOR_FIELDS) - {"job_config", "validation_dataloader"}
    if set(fields) != expected:
        raise TypeError(f"init_validator: expected fields {sorted(expected)}, got {sorted(fields)}")
    validator.validation_dataloader = validation_dataloader
    for name, value in fields.items():
        setattr(validator, name, value)


def model_converter_names() -> set[str]:
    """The names ``model.converters`` may hold: the keys of the registry ``ModelConvertersContainer``
    looks each up in (an unknown one is a ``KeyError`` once the model is built)."""
    from torchtitan.protocols import model_converter

    return set(model_converter._registry_model_converter_cls)


# ------------------------------------------------------------------------ checkpointing


def checkpointer_folder(checkpointer: Any) -> str | None:
    """The checkpoint folder, or None when checkpointing is disabled (then the
    CheckpointManager never sets ``folder``)."""
    return checkpointer.folder if checkpointer.enable else None


def will_save(checkpointer: Any, step: int, last_step: bool) -> bool:
    """Whether ``checkpointer.save(step, last_step)`` will write a checkpoint: the rule
    TorchTitan applies (enabled, not load-only, first step if asked, last step, interval)."""
    return checkpointer._should_save(step, last_step=last_step)


@contextmanager
def _attributes_set(obj: Any, **values: Any) -> Iterator[None]:
    old = {name: getattr(obj, name) for name in values}
    for name, value in values.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(obj, name, value)


def save_full_checkpoint(checkpointer: Any, step: int) -> None:
    """Save every state of ``step`` now, synchronously, whatever the interval.

    TorchTitan's ``save`` writes only on interval steps, except for the last step, which
    it writes synchronously after waiting for any asynchronous save still in flight.
    That last-step path is the one wanted here, with the full state instead of the
    weights-only export that ``last_save_model_only`` makes of a finished run.
    """
    with _attributes_set(checkpointer, last_save_model_only=False, last_save_in_hf=False):
        checkpointer.save(curr_step=step, last_step=True)


def on_save_error(checkpointer: Any, handler: Callable[[int, BaseException], None]) -> None:
    """Call ``handler(step, error)`` when a save of ``checkpointer`` fails, before the error
    goes on (the handler may raise another in its place).

    Every save goes through the instance's ``save(curr_step, ...)``: TorchTitan's ``train()``
    (interval and last step) and ``main()`` (seed checkpoint), and ours; the method is
    wrapped on this instance only, synchronous saves raise there.
    """
    from torch.distributed.checkpoint.api import CheckpointException  # DCP's, a BaseException

    save = checkpointer.save

    @functools.wraps(save)
    def save_or_report(curr_step: int, *args: Any, **kwargs: Any) -> Any:
        try:
            return save(curr_step, *args, **kwargs)
        except (Exception, CheckpointException) as e:
            handler(curr_step, e)
            raise

    checkpointer.save = save_or_report


# ------------------------------------------------------------------------ optimizers and LR schedules


def optimizer_per_model_part(optimizers: Any) -> list[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """Each model part with the torch optimizer TorchTitan built over its parameters."""
    return list(zip(optimizers.model_parts, optimizers.optimizers, strict=True))


def lr_lambda(lr_scheduler_config: Any, training_steps: int) -> Callable[[int], float]:
    """TorchTitan's warm-up / stable / decay factor for these settings, as
    ``build_lr_schedulers`` gives it to every ``LambdaLR`` (built here on a probe optimizer)."""
    from torchtitan.components.lr_scheduler import build_lr_schedulers

    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    (scheduler,) = build_lr_schedulers([probe], lr_scheduler_config, training_steps).schedulers
    return scheduler.lr_lambdas[0]


def lr_schedulers_per_group(optimizers: Any, lr_lambdas: list[Callable[[int], float]]) -> Any:
    """TorchTitan's ``LRSchedulersContainer`` (so checkpoints and logging stay TorchTitan's)
    whose ``LambdaLR``s apply ``lr_lambdas[i]`` to param group ``i``."""
    from torchtitan.components.lr_scheduler import LRSchedulersContainer

    return LRSchedulersContainer(optimizers, lr_lambdas)


# ------------------------------------------------------------------------ the trainer


class TrainerHooks(Trainer):
    """TorchTitan's Trainer with the two hooks ``DispersionTrainer`` needs, and no flight-recorder folder
    on a CPU."""

    _loaded = False

    def init_distributed(self) -> Any:
        """TorchTitan's, without a flight-recorder folder on a CPU: its dumps are NCCL's, on a GPU
        collective's timeout, and gloo writes none (``comm.save_traces_folder`` stayed an empty folder)."""
        if uses_cpu():
            self.job_config.comm.trace_buf_size = 0
        return super().init_distributed()

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
        """TorchTitan's non-pipelined ``forward_backward_step``, with the model call, the loss
        and the backward handed to ``model_forward_backward`` (inside the train context)."""
        if self.parallel_dims.pp_enabled:
            raise NotImplementedError("dispersion_titan does not support pipeline parallelism")
        inputs, labels, extra_inputs, extra_kwargs = self.post_dataloading_process(input_dict, labels)
        (model,) = self.model_parts
        with self.train_context():
            return self.model_forward_backward(
                model, inputs, labels, global_valid_tokens, {**extra_inputs, **extra_kwargs}
            )

    def model_forward_backward(
        self,
        model: torch.nn.Module,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor,
        model_kwargs: dict[str, Any],
    ) -> torch.Tensor:
        """Forward (under ``self.maybe_enable_amp``), loss sum / ``global_valid_tokens``,
        backward; returns the detached loss to log."""
        raise NotImplementedError


# ------------------------------------------------------------------------ plan's fake world


class _NoValues(TorchDispatchMode):
    """A read of a value that no fake tensor holds answers 0: the one such read of an init,
    ``torch.nn.init.trunc_normal_``'s (whether a draw fell outside the bounds), ends its
    resampling loop at the first draw (the values do not exist)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        try:
            return func(*args, **(kwargs or {}))
        except DataDependentOutputException:
            return 0


def _outside_fake_mode(fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with unset_fake_temporarily():
            return fn(*args, **kwargs)

    return call


@functools.cache
def fake_world_family(name: str) -> str:
    """The name of a TrainSpec of our own, ``name``'s as a trainer built under ``FakeTensorMode``
    needs it: the model built and parallelized outside the mode, from real meta tensors (a fake
    meta parameter cannot be swapped for its CPU one by ``to_empty``: PyTorch refuses tensors
    with weak references; the meshes FSDP2 builds over tensor-parallel ones read values back),
    then moved off the meta device in the mode and initialised under ``_NoValues``."""
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec

    spec = get_train_spec(name)

    def model_cls(model_args: Any) -> torch.nn.Module:
        model = _outside_fake_mode(spec.model_cls)(model_args)
        init_weights = model.init_weights

        def fake_init(*args: Any, **kwargs: Any) -> None:
            with _NoValues():
                init_weights(*args, **kwargs)

        model.init_weights = fake_init
        return model

    fake = f"{name}.fake_world"
    register_train_spec(
        fake, dataclasses.replace(spec, model_cls=model_cls, parallelize_fn=_outside_fake_mode(spec.parallelize_fn))
    )
    return fake


def optimizer_step(trainer: Trainer, batches: list, after_each: Callable[[], None] = lambda: None) -> None:
    """One optimizer step as ``Trainer.train_step`` takes it, on ``batches`` (its micro-batches), each
    moved to the trainer's device first (under ``FakeTensorMode`` on a GPU: a fake CUDA copy): gradients
    cleared, each micro-batch's ``forward_backward_step``, the gradients clipped, the optimizers
    stepped. The global token count is the global batch's (its all-reduce would read a fake value back);
    logging and the learning-rate schedule are left out. ``after_each`` runs after each backward."""
    from torchtitan.distributed import utils as dist_utils

    t = trainer.job_config.training
    device = trainer.device if trainer.device.type != "cpu" else torch.device("cpu")  # a fake "cpu:0" is not "cpu"
    tokens = torch.tensor(float(t.global_batch_size * t.seq_len), device=device)
    trainer.optimizers.zero_grad()
    for input_dict, labels in batches:
        inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in input_dict.items()}
        trainer.forward_backward_step(input_dict=inputs, labels=labels.to(device), global_valid_tokens=tokens)
        after_each()
    dist_utils.clip_grad_norm_([p for m in trainer.model_parts for p in m.parameters()], t.max_norm, foreach=True)
    trainer.optimizers.step()
