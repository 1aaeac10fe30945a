"""The dispersion term of L = L_CE + λ·mean_ℓ L_disp(Z_ℓ). Gradients are summed over ranks and
micro-batches, so a micro-batch of ``b`` of ``G`` sequences contributes ``(b/G)·mean_local``: the
global batch's mean, whatever the layout. Under sequence parallelism a TP rank holds a slice of every
sequence, but a pairwise loss needs whole ones: one all-to-all hands each rank whole sequences of its
own share (``own_sequences``), whose partial sums add up to the whole (no TP-fold recomputation).

The dispersion points (``dispersion.points``) are captured by forward hooks on ``model.layers`` and
``model.norm`` (``BlockOutputs``). Registered after ``parallelize_fn``, each sits outside activation
checkpointing's recomputation and ``torch.compile``: it fires once per forward and keeps the very
tensor the next module consumes, so the gradient flows through it (under TP its local shard).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.nn.functional import all_to_all_single

from ..config.schema import Dispersion, resolve_layers
from ..losses import dispersion_loss, mean_offdiag_cosine
from ..losses.dispersion import KernelUnavailable, check_triton_kernel, select_tokens
from ..utils.dtensor import local_tensor
from ..utils.errors import ConfigError


def mixed_seed(*parts: int) -> int:
    """One 63-bit seed from layout-free integers (seed, step, chunk, ...), in order: token subsets here,
    dropout masks and the baselines' draws."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % 2**63
    return seed


class BlockOutputs:
    """Hooks on the dispersion points; ``take()`` hands over one training forward's outputs."""

    def __init__(self, model: nn.Module, points: str) -> None:
        blocks = list(model.layers.values())
        modules = blocks if points == "blocks" else [*blocks[:-1], model.norm]  # hidden_states: the last, the norm
        self.count = len(modules)
        self._outputs: dict[int, torch.Tensor] = {}
        for index, module in enumerate(modules):
            module.register_forward_hook(functools.partial(self._capture, index))

    def _capture(self, index: int, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return
        if index in self._outputs:
            raise RuntimeError(f"dispersion point {index + 1}'s forward hook fired twice before its outputs were taken")
        self._outputs[index] = local_tensor(output)

    def take(self) -> list[torch.Tensor]:
        """The outputs of the forward that just ran, point 1 first; the hooks start afresh."""
        outputs, self._outputs = self._outputs, {}
        if len(outputs) != self.count:
            raise RuntimeError(f"captured {len(outputs)} of {self.count} dispersion points in one training forward")
        return [outputs[i] for i in range(self.count)]


def shares(batch: int, world: int) -> list[int]:
    """Sequences owned by each TP rank: contiguous blocks, the first ``batch % world`` one more."""
    return [batch // world + (r < batch % world) for r in range(world)]


def own_sequences(local: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Whole sequences [b_r, N, d] of this TP rank's share of [B, N/tp, d] (unchanged without TP);
    the backward (torch's, of the all-to-all) sends each slice's gradient back to the rank that holds it."""
    if group is None:
        return local
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    slice_len, rest = local.shape[1], local.shape[2:]
    splits = shares(local.shape[0], world)
    owned = splits[rank]
    # Row block s of the result holds source rank s's slice of the owned sequences.
    received = all_to_all_single(
        local.new_empty((owned * world, *local.shape[1:])), local.contiguous(), [owned] * world, splits, group
    )
    return received.view(world, owned, slice_len, *rest).transpose(0, 1).reshape(owned, world * slice_len, *rest)


@dataclass
class MicrobatchDispersion:
    weighted: torch.Tensor | None
    """λ·(b/G)·mean_ℓ L_disp, with grad; None for ``none``."""
    weighted_value: torch.Tensor
    """``weighted``'s value, detached (0 for ``none``)."""
    unweighted: torch.Tensor
    """(b/G)·mean_ℓ L_disp, detached (0 for ``none``)."""
    block_cosine_sums: torch.Tensor | None
    """Σ over this micro-batch's sequences of each block's mean off-diagonal cosine."""


class DispersionObjective:
    def __init__(
        self, cfg: Dispersion, n_layers: int, global_batch_size: int, seed: int, tp_group: dist.ProcessGroup | None
    ):
        self.cfg = cfg
        self.active = cfg.variant != "none"
        self.layers = resolve_layers(cfg.layers, n_layers)
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.tp_group = tp_group
        self.loss = dispersion_loss  # what ``plan`` prices in its place: planning.step_measure.PricedTerm
        self.options = {
            key: getattr(cfg, key) for key in ("tau", "clamp", "lambda_norm", "kernel", "precision", "form")
        }

    def check_kernel(self, device: torch.device) -> None:
        """Probe the Triton kernel ``kernel = "auto"`` takes on CUDA: a failure is one line."""
        if self.active and self.cfg.kernel == "auto" and device.type == "cuda":
            try:
                check_triton_kernel(device, self.cfg.variant, self.cfg.precision)
            except KernelUnavailable as err:
                raise ConfigError(f"dispersion.kernel: {err}") from None

    def _generator(self, step: int, chunk: int, layer: int, device: torch.device) -> torch.Generator | None:
        """A fresh token subset per layer and micro-batch, as the authors' ``DispersionLoss`` draws, seeded
        by (seed, step, chunk, layer) on the hidden states' device (no host sync); chunk m·W + r is
        micro-batch m of DP rank r of W."""
        if not self.cfg.max_tokens:
            return None
        return torch.Generator(device=device).manual_seed(mixed_seed(self.seed, step, chunk, layer))

    def __call__(
        self, block_outputs: list[torch.Tensor], step: int, with_stats: bool, chunk: int
    ) -> MicrobatchDispersion:
        """The term of micro-batch ``chunk``. Under TP each rank computes its share of the sequences
        (``own_sequences``); logged values (``with_stats``) are summed over TP ranks."""
        wanted = range(len(block_outputs)) if with_stats else self.layers if self.active else ()
        owned = {i: own_sequences(block_outputs[i], self.tp_group) for i in wanted}
        owned_batch = next(iter(owned.values())).shape[0] if owned else 0
        scale = owned_batch / self.global_batch_size
        weighted = None
        unweighted = torch.zeros((), device=block_outputs[0].device)
        weighted_value = unweighted
        if self.active:
            if owned_batch == 0:  # a TP rank with no sequence still joins the backward all-to-alls
                mean = sum(owned[i].sum().float() for i in self.layers)
            else:
                # The chosen layers as one batch of L·b sequences (read in place): its mean is the
                # mean over layers of each layer's mean.
                layers = [
                    select_tokens([owned[i]], self.cfg.max_tokens, self._generator(step, chunk, i, owned[i].device))[0]
                    for i in self.layers
                ]
                mean = self.loss(layers, self.cfg.variant, **self.options) * scale
            warmup = self.cfg.warmup_steps  # λ at ``step`` (1-based): the peak coeff after the optional linear warm-up
            weighted = mean * self.cfg.coeff * (min(1.0, step / warmup) if warmup > 0 else 1.0)
            unweighted, weighted_value = mean.detach(), weighted.detach()
        stats = None
        if with_stats:
            with torch.no_grad():
                stats = torch.stack(
                    [
                        mean_offdiag_cosine(owned[i].detach()) * owned_batch if owned_batch else unweighted * 0
                        for i in range(len(block_outputs))
                    ]
                )
                if self.tp_group is not None:
                    logged = torch.cat([unweighted.reshape(1), weighted_value.reshape(1), stats])
                    dist.all_reduce(logged, group=self.tp_group)
                    unweighted, weighted_value, stats = logged[0], logged[1], logged[2:]
        return MicrobatchDispersion(weighted, weighted_value, unweighted, stats)
