"""``plan --dry-run-step``: the real trainer as rank 0 of the planned world (``fake_world``) on the CPU
profile, shrunk in depth and tokens (which the checks do not depend on), one optimizer step taken.
It checks what a cluster would otherwise find out: the mesh, every parameter's placement and shard,
and the dispersion term's global-batch accounting; a failure is one line. The collectives move
nothing, so only shapes and scales are checked, not values."""

from __future__ import annotations

import math
import time
from fractions import Fraction
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed._composable.replicate import DDP
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from ..components.titan_compat import optimizer_step
from ..config.cli import without_profile
from ..config.schema import resolve_layers
from ..job_config.parse import validated_args
from ..trainer.objective import DispersionObjective, own_sequences, shares
from ..trainer.trainer import DispersionTrainer
from ..utils.dtensor import local_tensor
from ..utils.errors import ConfigError
from .fake_world import rank_zero_trainer
from .figures import counted
from .resource_plan import ResourceLayout, resolve_layout

if TYPE_CHECKING:
    from ..config.schema import RunConfig

DRY_RUN_BLOCKS = 2
DRY_RUN_TOKENS = 128


def _expected_mesh(layout: ResourceLayout) -> tuple[str, ...]:
    return tuple(
        name
        for name, size in (("dp_replicate", layout.dp_replicate), ("fsdp", layout.dp_shard), ("tp", layout.tp))
        if size > 1
    )


def check_mesh(trainer: DispersionTrainer, layout: ResourceLayout) -> str:
    pd = trainer.parallel_dims
    found = {"dp_replicate": pd.dp_replicate, "fsdp": pd.dp_shard, "tp": pd.tp, "world": pd.world_size}
    wanted = {"dp_replicate": layout.dp_replicate, "fsdp": layout.dp_shard, "tp": layout.tp, "world": layout.gpus}
    if found != wanted:
        raise ConfigError(f"mesh: the trainer built {found}, the plan is {wanted}")
    sizes = {name: pd.get_mesh(name).size() for name in _expected_mesh(layout)}
    if any(sizes[name] != wanted[name] for name in sizes):
        raise ConfigError(f"mesh: dimension sizes {sizes}, the plan is {wanted}")
    loader = (trainer.dataloader.dp_world_size, trainer.dataloader.dp_rank)
    if loader != (layout.dp, 0):
        raise ConfigError(f"mesh: the data loader reads as rank {loader[1]} of {loader[0]}, not 0 of {layout.dp}")
    dims = " × ".join(f"{name} {size}" for name, size in sizes.items()) or "one rank"
    return f"mesh: {dims} of {counted(layout.gpus, 'rank')}, the data loader rank 0 of {layout.dp}: as planned"


def check_parallelize(model: nn.Module, layout: ResourceLayout, tied: bool) -> str:
    """The parallelize plan applied as planned."""
    mesh = _expected_mesh(layout)
    replicated = mesh == ("dp_replicate",)  # DDP: whole parameters as plain tensors, the module wrapped
    if replicated:
        if not isinstance(model, DDP):
            raise ConfigError("parallelize: the model is not replicated by DDP over dp_replicate")
        mesh = ()
    params = list(model.named_parameters())
    on_tp = 0
    for name, p in params if mesh else ():
        if not isinstance(p, DTensor) or p.device_mesh.mesh_dim_names != mesh:
            where = p.device_mesh.mesh_dim_names if isinstance(p, DTensor) else "a plain tensor"
            raise ConfigError(f"parallelize: {name} is on {where}, not a DTensor on {mesh}")
        # a placement's "dim": the tensor dimension it shards (FSDP2's strided shard too); none if replicated
        if "fsdp" in mesh and getattr(p.placements[mesh.index("fsdp")], "dim", None) != 0:
            raise ConfigError(f"parallelize: {name} is not sharded by FSDP ({p.placements})")
        placed, _ = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)  # torch >= 2.11
        if tuple(p.to_local().shape) != placed:
            raise ConfigError(
                f"parallelize: {name}'s shard on rank 0 is {tuple(p.to_local().shape)}, its placements "
                f"{p.placements} give {placed}"
            )
        on_tp += "tp" in mesh and getattr(p.placements[mesh.index("tp")], "dim", None) is not None
    if tied and model.output.weight is not model.tok_embeddings.weight:
        raise ConfigError("parallelize: the LM head is no longer the token embeddings (model.tie_embeddings)")
    if layout.tp > 1 and not on_tp:
        raise ConfigError("parallelize: tensor parallelism sharded no parameter")
    local = sum(local_tensor(p).numel() for _, p in params)
    if mesh:
        where = f"DTensors on ({', '.join(mesh)}), each holding rank 0's shard of its placements"
    elif replicated:
        where = "whole, replicated by DDP over dp_replicate"
    else:
        where = "whole"
    tp = f", {on_tp} sharded over tp" if layout.tp > 1 else ""
    tie = "; the LM head still the token embeddings" if tied else ""
    return f"parallelize: {len(params)} parameters, {where}{tp}{tie}; rank 0 holds {local:,}"


def check_dispersion(trainer: DispersionTrainer, layout: ResourceLayout, seq_len: int) -> str:
    """Each rank's share of the term, and the division that makes the sum the global mean."""
    objective, g = trainer.dispersion, layout.global_batch
    if objective.global_batch_size != g:
        raise ConfigError(f"dispersion: the term divides by {objective.global_batch_size}, the global batch is {g}")
    if trainer.gradient_accumulation_steps != layout.accumulation:
        raise ConfigError(
            f"dispersion: {counted(trainer.gradient_accumulation_steps, 'micro-batch', 'micro-batches')} per step, "
            f"the plan has {layout.accumulation}"
        )
    owned = shares(layout.micro_batch, layout.tp)
    total = Fraction(layout.dp * layout.accumulation * sum(owned), g)
    if total != 1:
        raise ConfigError(f"dispersion: the ranks' shares add up to {total} of the global batch, not 1")
    cfg = trainer.job_config.dispersion
    if cfg.variant == "none":
        return (
            f"dispersion: none; the ranks' sequences add up to the global batch ({layout.dp} × "
            f"{layout.accumulation} × {layout.micro_batch} = {g})"
        )
    dim, n_points = trainer.model_args.dim, trainer.block_outputs.count
    chosen = len(resolve_layers(cfg.layers, trainer.model_args.n_layers))
    generator = torch.Generator().manual_seed(0)
    slice_len = seq_len // layout.tp
    hidden = [torch.randn(layout.micro_batch, slice_len, dim, generator=generator) for _ in range(n_points)]
    if layout.tp > 1:  # the collectives are fake: the shape of rank 0's whole sequences, not their values
        got = tuple(own_sequences(hidden[0], objective.tp_group).shape)
        if got != (owned[0], seq_len, dim):
            raise ConfigError(f"dispersion: rank 0 of TP {layout.tp} gets {got}, not {(owned[0], seq_len, dim)}")
        ratio_note = "its term's values ride on the fake all-to-all and are not checked"
    else:
        term = objective(hidden, 1, False, 0).unweighted
        own_mean = DispersionObjective(cfg, trainer.model_args.n_layers, owned[0], objective.seed, None)(
            hidden, 1, False, 0
        ).unweighted
        ratio = (term / own_mean).item()
        if not math.isclose(ratio, owned[0] / g, rel_tol=1e-6):
            raise ConfigError(f"dispersion: rank 0's term is {ratio:.6g} × its own mean, not {owned[0]}/{g}")
        ratio_note = f"its term is {owned[0]}/{g} × its own mean (on random hidden states: {ratio:.6g})"
    tokens = min(seq_len, cfg.max_tokens or seq_len)
    pairs = tokens * (tokens - 1)
    return (
        f"dispersion: rank 0 owns {owned[0]} of each micro-batch's {counted(layout.micro_batch, 'sequence')} "
        f"({layout.accumulation} per step), {counted(tokens, 'token')} and {counted(pairs, 'ordered pair')} each, "
        f"on {counted(chosen, 'block')}; {ratio_note}; {counted(layout.dp, 'DP rank')} × "
        f"{counted(layout.accumulation, 'micro-batch', 'micro-batches')} × {counted(sum(owned), 'sequence')} / "
        f"{g} = 1: the sum over ranks is the global-batch mean"
    )


def dry_run_step(args: list[str], full: ResourceLayout) -> list[str]:
    """The checks' lines for ``args`` in the layout ``full`` (``ConfigError`` on the first failure), run on
    the CPU profile, shrunk (tokens a multiple of the TP degree)."""
    blocks, tokens, gpus = min(full.n_layers, DRY_RUN_BLOCKS), min(full.seq_len, DRY_RUN_TOKENS), full.gpus
    tokens -= tokens % full.tp
    said = [f"{blocks} of {full.n_layers} blocks"] if blocks < full.n_layers else []
    said += [f"{tokens} of {full.seq_len} tokens"] if tokens < full.seq_len else []
    shrunk = [
        *without_profile(args),  # the one profile there is, given once
        "--profile",
        "cpu",
        "--model.n_layers",
        str(blocks),
        "--training.seq_len",
        str(tokens),
        "--validation.no-enable",
    ]
    job_config: RunConfig = validated_args(shrunk, gpus)
    layout = resolve_layout(job_config, gpus, full.nodes)
    start = time.perf_counter()
    with rank_zero_trainer(job_config, gpus) as trainer:
        head = f"dry-run step: rank 0 of {gpus} (fake_backend), --profile cpu, {', '.join(said) or 'not shrunk'}"
        lines = [head, check_mesh(trainer, layout)]
        (model,) = trainer.model_parts
        lines.append(check_parallelize(model, layout, trainer.model_args.tie_embeddings))
        lines.append(check_dispersion(trainer, layout, job_config.training.seq_len))
        optimizer_step(trainer, [next(trainer.batch_generator(trainer.dataloader))])
    lines.append(
        f"step: one micro-batch's forward and backward ({job_config.dispersion.variant}), clipping and the "
        f"optimizer step ran ({time.perf_counter() - start:.1f} s with the build)"
    )
    return lines
