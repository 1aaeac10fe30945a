"""A step's peak memory per GPU by category and its roofline time, measured on rank 0 of the planned
world without allocating: the trainer under ``FakeTensorMode``, one optimizer step (two micro-batches
where it accumulates) under PyTorch's memory trackers and a roofline (``Roofline``), the dispersion term
priced as its GPU kernels run (``PricedTerm``). Blocks are alike, so a deep model is measured at
``MEASURED_DEPTHS`` and extrapolated (exact while the term takes every block)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only
from torch.utils._runtime_estimation import _FLOAT_TYPES, _IGNORE_OPS, get_num_bytes
from torch.utils.flop_counter import flop_registry

from ..components.titan_compat import optimizer_per_model_part, optimizer_step
from ..utils.dtensor import local_tensor
from .fake_world import rank_zero_trainer
from .figures import GPU, counted, term_seconds

if TYPE_CHECKING:
    from ..config.schema import RunConfig

MEASURED_DEPTHS = (2, 3)
CATEGORIES = {
    "parameters": ("Sharded Param", "Unsharded Param", "Parameter", "Buffer"),
    "gradients": ("Sharded Grad", "Unsharded Grad", "Gradient"),
    "optimizer": ("OptState", "Optstate"),
    "activations": ("Activation",),
    "temporaries": ("Temp",),
    "collectives": ("All Gather", "Reduce Scatter"),
    "other": ("Inputs", "Other"),
}
"""PyTorch's memory trackers' categories as a plan shows them."""


@dataclass(frozen=True)
class StepMeasurement:
    memory: dict[str, float]
    """Bytes per ``CATEGORIES`` key at the step's peak."""
    micro_batch_s: float
    """Roofline seconds of one micro-batch's forward and backward."""
    optimizer_s: float
    """Roofline seconds of clipping and the optimizer step."""
    params_local: float
    """Parameters this rank holds (its shards)."""
    params_total: float
    saved_total: float
    """Entries of the model's state dict, which a checkpoint saves: a tied embedding twice (embeddings and head)."""
    depth: int
    """Blocks of the model measured (or extrapolated to)."""
    term_s: float
    """Seconds of one micro-batch's dispersion term (``figures.term_seconds``), outside the roofline."""
    extrapolated: bool = False

    @property
    def peak(self) -> float:
        return sum(self.memory.values())

    @property
    def depth_note(self) -> str:
        if self.extrapolated:
            blocks = " and ".join(map(str, MEASURED_DEPTHS))
            return f"measured at {blocks} blocks, extrapolated to {self.depth} (linear in depth)"
        return f"measured at all {counted(self.depth, 'block')}"


aten = torch.ops.aten
FLOPS = {
    **flop_registry,
    aten._scaled_dot_product_flash_attention_for_cpu: flop_registry[aten._scaled_dot_product_flash_attention],
    aten._scaled_dot_product_flash_attention_for_cpu_backward: flop_registry[
        aten._scaled_dot_product_flash_attention_backward
    ],
}
COLLECTIVES = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor")
COMPUTE_SHARE = 0.75
"""``torch.utils._runtime_estimation.flops_to_ns``: the share of peak a roofline operator reaches."""


class Roofline(TorchDispatchMode):
    """Sums ``seconds``, the roofline time of every operator run under it on ``gpu``, a GPU this machine
    need not have: PyTorch's ``RuntimeEstimator`` roofline with the GPU's published peaks. Per operator
    the larger of its compute time (FLOPs at ``COMPUTE_SHARE`` of peak) and its bytes at the HBM
    bandwidth. Unlike it: a DTensor is priced by its local shard, collectives are left to
    ``resource_plan.step_time``, CPU flash attention is priced as CUDA's."""

    def __init__(self, gpu: GPU) -> None:
        super().__init__()
        self.gpu = gpu
        self.seconds = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in _IGNORE_OPS or func.namespace in COLLECTIVES:
            return out
        args, kwargs, local_out = tree_map_only(DTensor, DTensor.to_local, (args, kwargs, out))
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_flatten(local_out)[0] if isinstance(t, torch.Tensor)]
        if not outputs:  # a query (prim.device, sym sizes) moves no data
            return out
        transfer = sum(get_num_bytes(t) for t in inputs + outputs) / self.gpu.hbm_bytes_per_s
        compute = 0.0
        dtypes = {t.dtype for t in outputs if t.dtype in _FLOAT_TYPES}
        if packet in FLOPS and len(dtypes) == 1:
            flops = FLOPS[packet](*args, **kwargs, out_val=local_out)
            half = dtypes.pop() in (torch.bfloat16, torch.float16)
            compute = flops / 2 / (COMPUTE_SHARE * (self.gpu.bf16_flops if half else self.gpu.fp32_flops))
        self.seconds += max(transfer, compute)
        return out


class _KernelStandIn(torch.autograd.Function):
    """What the fused kernels hold and write: the layers saved, a scalar, a gradient per layer."""

    @staticmethod
    def forward(ctx, *layers: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(*layers)
        return layers[0].new_zeros((), dtype=torch.float32)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.empty_like(layer) for layer in ctx.saved_tensors)


class PricedTerm:
    """The objective's loss in a planned step: the kernels' time summed in ``seconds``, their memory
    by ``_KernelStandIn``."""

    def __init__(self, gpu: GPU) -> None:
        self.gpu = gpu
        self.seconds = 0.0

    def __call__(self, layers: list[torch.Tensor], variant: str, **_options) -> torch.Tensor:
        b, n, d = layers[0].shape
        self.seconds += term_seconds(variant, b * len(layers), n, d, self.gpu.bf16_flops)
        return _KernelStandIn.apply(*layers)


def measure_at(job_config: RunConfig, world: int, gpu: GPU, depth: int) -> StepMeasurement:
    """One step of ``job_config`` (checked for ``world`` processes) with ``depth`` blocks."""
    config = copy.deepcopy(job_config)
    config.model.n_layers = depth
    par, t = config.parallelism, config.training
    replicas = par.data_parallel_replicate_degree
    replicated = replicas > 1 and par.data_parallel_shard_degree == 1
    if replicated:  # DDP measured as one replica (DDP's lazy init reads values)
        par.data_parallel_replicate_degree, world = 1, world // replicas
        if t.global_batch_size > 0:
            t.global_batch_size //= replicas
    # A GPU's flash kernel applies attention dropout inside (no mask); a CPU's math kernel would keep
    # the N × N probabilities and mask. Measured at attention dropout 0, as the GPU runs it.
    if getattr(config.model, "attn_dropout", None):
        config.model.attn_dropout = 0.0
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with rank_zero_trainer(config, world, fake) as trainer:
        data = trainer.batch_generator(trainer.dataloader)  # its own loader's, as real tensors
        batches = [next(data) for _ in range(min(trainer.gradient_accumulation_steps, 2))]
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
                optimizer_step(trainer, batches, after_each)
        local = sum(local_tensor(p).numel() for p in model.parameters())
        total = sum(p.numel() for p in model.parameters())
        saved = sum(v.numel() for v in model.state_dict().values())
    (peak,) = tracker.get_tracker_snapshot("peak").values()  # one device
    named = {getattr(key, "value", key): value for key, value in peak.items()}  # by the trackers' enums
    memory = {name: float(sum(named.get(k, 0) for k in keys)) for name, keys in CATEGORIES.items()}
    if replicated:  # DDP's gradient buckets (gradient_as_bucket_view off): a second copy of the fp32 gradients
        memory["gradients"] += 4.0 * total
    term_s = term.seconds / len(batches)
    optimizer_s = roofline.seconds - marks[-1]
    return StepMeasurement(memory, marks[0], optimizer_s, float(local), float(total), float(saved), depth, term_s)


def measure_step(job_config: RunConfig, world: int, gpu: GPU, depth: int) -> StepMeasurement:
    """The step at ``depth`` blocks: on the line through ``MEASURED_DEPTHS`` where the term (if any)
    takes every block and that is cheaper, else measured."""
    d = job_config.dispersion
    if depth < sum(MEASURED_DEPTHS) or (d.variant != "none" and d.layers != "all"):
        return measure_at(job_config, world, gpu, depth)
    a, b = (measure_at(job_config, world, gpu, d) for d in MEASURED_DEPTHS)
    w = (depth - a.depth) / (b.depth - a.depth)
    line = {f.name: x + (getattr(b, f.name) - x) * w for f in fields(a) if isinstance(x := getattr(a, f.name), float)}
    memory = {k: a.memory[k] + (b.memory[k] - a.memory[k]) * w for k in a.memory}
    return replace(a, memory=memory, depth=depth, extrapolated=True, **line)
