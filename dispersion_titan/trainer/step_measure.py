"""A training step's peak memory per GPU by category, and its roofline time, measured on rank 0
of the planned world without allocating anything: ``DispersionTrainer`` built under
``FakeTensorMode`` (``fake_world``), its optimizer state created by a first step on zero
gradients, then one optimizer step (the dispersion term included) under PyTorch's
``FSDPMemTracker`` (``MemTracker`` without FSDP) and ``planning.roofline``. Two of the step's
micro-batches are run where it accumulates: the second one's backward meets the first one's
gradients. Attention dropout is measured as a GPU's fused kernels run it (see ``measure_at``).
The dispersion term is priced as the GPU runs it, by its fused kernels (``PricedTerm``), not by
the torch path a CPU would take.

Every block is alike, so memory and time are linear in the depth: a deep model is measured at
``MEASURED_DEPTHS`` blocks and extrapolated, exactly while the dispersion term takes every block
(a selection such as ``late_half`` is measured at full depth)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from ..components.titan_compat import optimizer_per_model_part
from ..planning.figures import term_seconds
from ..planning.gpus import GPU
from ..planning.measurement import StepMeasurement, categorised, on_the_line
from ..planning.roofline import Roofline
from .fake_world import micro_batches, optimizer_step, rank_zero_trainer

if TYPE_CHECKING:
    from ..config.run_config import RunConfig

MEASURED_DEPTHS = (2, 3)


class _KernelStandIn(torch.autograd.Function):
    """What the fused kernels hold and write: the layers saved for the backward (as they are, no
    copy), a scalar forward, a gradient of each layer's shape."""

    @staticmethod
    def forward(ctx, *layers: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*layers)
        return layers[0].new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.empty_like(layer) for layer in ctx.saved_tensors)


class PricedTerm:
    """The objective's loss during a planned step: the fused kernels' time at their measured rate
    (``planning.figures.term_seconds``) summed in ``seconds``, their memory by ``_KernelStandIn``."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu
        self.seconds = 0.0

    def __call__(self, layers: list[torch.Tensor], variant: str, **_options) -> torch.Tensor:
        b, n, d = layers[0].shape
        self.seconds += term_seconds(variant, b * len(layers), n, d, self.gpu.bf16_flops)
        return _KernelStandIn.apply(*layers)


def _one_replica(config: RunConfig, world: int) -> tuple[int, bool]:
    """A replicated layout (DDP: every process holds the whole model) measured as one of its
    replicas, a 1-process job of the same micro-batches (DDP's lazy init reads parameter values,
    which fake tensors lack): the world to build, and whether it was replicated."""
    p, t = config.parallelism, config.training
    replicas = p.data_parallel_replicate_degree
    if replicas <= 1 or p.data_parallel_shard_degree != 1:
        return world, False
    p.data_parallel_replicate_degree = 1
    if t.global_batch_size > 0:
        t.global_batch_size //= replicas
    return world // replicas, True


def measure_at(job_config: RunConfig, world: int, gpu: GPU, depth: int) -> StepMeasurement:
    """One step of ``job_config`` (checked for ``world`` processes) with ``depth`` blocks."""
    config = copy.deepcopy(job_config)
    config.model.n_layers = depth
    world, replicated = _one_replica(config, world)
    # On a GPU, SDPA's flash and memory-efficient kernels apply attention dropout inside the
    # kernel (a Philox seed, no mask); on a CPU only the math kernel takes dropout, keeping the
    # B × heads × N × N probabilities, their mask and the dropped product, which a GPU never
    # allocates. Measured at attention dropout 0: the flash kernel, as the GPU runs it (residual
    # and embedding dropout, elementwise, stay).
    if getattr(config.model, "attn_dropout", None):
        config.model.attn_dropout = 0.0
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with rank_zero_trainer(config, world, fake) as trainer:
        accumulation = trainer.gradient_accumulation_steps
        batches = micro_batches(trainer, min(accumulation, 2))
        t = trainer.job_config.training
        tokens = torch.tensor(float(t.global_batch_size * t.seq_len))
        ((model, optimizer),) = optimizer_per_model_part(trainer.optimizers)
        with fake:
            for p in model.parameters():  # the optimizer's state exists from the first step on
                p.grad = torch.zeros_like(p)
            trainer.optimizers.step()
            if isinstance(model, FSDPModule):
                tracker = FSDPMemTracker(model, optimizer)
            else:
                tracker = MemTracker()
                tracker.track_external(model, optimizer)
            roofline = Roofline(gpu)
            term = trainer.dispersion.loss = PricedTerm(gpu)
            marks: list[float] = []

            def after_each() -> None:  # the trackers keep per-module stats of one forward at a time
                marks.append(roofline.seconds)
                tracker.reset_mod_stats()

            with tracker, roofline:
                optimizer_step(trainer, batches, tokens, after_each=after_each)
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
        total = sum(p.numel() for p in model.parameters())
    (peak,) = tracker.get_tracker_snapshot("peak").values()  # one device
    memory = categorised(peak)
    if replicated:  # DDP's gradient buckets (gradient_as_bucket_view off): a second copy of the fp32 gradients
        memory["gradients"] += 4.0 * total
    term_s = term.seconds / len(batches)
    return StepMeasurement(memory, marks[0], roofline.seconds - marks[-1], float(local), float(total), depth, term_s)


def extrapolates(job_config: RunConfig, depth: int) -> bool:
    """Whether the step at ``depth`` blocks is taken on the line through ``MEASURED_DEPTHS``: the
    dispersion term (if any) on every block, and deep enough that two shallow models cost less
    than the model itself."""
    d = job_config.dispersion
    return depth >= sum(MEASURED_DEPTHS) and (d.variant == "none" or d.layers == "all")


def measure_step(job_config: RunConfig, world: int, gpu: GPU, depth: int) -> StepMeasurement:
    """The step of ``job_config`` at ``depth`` blocks (the model's), measured or extrapolated."""
    if not extrapolates(job_config, depth):
        return measure_at(job_config, world, gpu, depth)
    low, high = (measure_at(job_config, world, gpu, d) for d in MEASURED_DEPTHS)
    return on_the_line(low, high, depth)
