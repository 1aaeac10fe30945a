"""The paper's baselines at training time (``[baseline]``): ``noisy_embedding`` (NEFTune) and
``active_forgetting`` (Chen et al. 2023; its param group and schedule: ``components.optimizers``).
Every draw is seeded by the run's seed and the step (and a sequence's place in the global batch),
never by a rank: both are layout-invariant and resume exactly.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchtitan.tools.logging import logger

from ..config.schema import Baseline
from ..models.gpt2.model import INIT_STD
from ..utils.dtensor import copy_full_into
from .objective import mixed_seed


class NoBaseline:
    def begin_step(self, step: int) -> None:
        """Called by the trainer before each training step (1-based)."""


class EmbeddingNoise(NoBaseline):
    """NEFTune, uniform noise in ±α/√(S·d) on the token embeddings in training forwards: a forward
    hook. Row ``i`` of micro-batch ``a`` on DP rank ``r`` of ``W`` is sequence ``(a·W + r)·b + i`` of
    the global batch (``data.packed.RankSlice``); under TP the hook adds its sequence shard's slice."""

    def __init__(
        self,
        embedding: nn.Module,
        alpha: float,
        seed: int,
        dp_rank: int,
        dp_degree: int,
        tp_group: dist.ProcessGroup | None,
    ) -> None:
        self.alpha, self.seed = alpha, seed
        self.dp_rank, self.dp_degree = dp_rank, dp_degree
        self.tp_group = tp_group
        self.step = self.microbatch = 0
        embedding.register_forward_hook(self._add_noise)

    def begin_step(self, step: int) -> None:
        self.step, self.microbatch = step, 0

    def _sequence_noise(self, position: int, seq_len: int, dim: int, device: torch.device) -> torch.Tensor:
        generator = torch.Generator(device=device).manual_seed(mixed_seed(self.seed, self.step, position))
        return torch.rand(seq_len, dim, generator=generator, device=device) * 2 - 1

    def _add_noise(self, module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor | None:
        if not module.training:
            return None
        rows, local_len, dim = out.shape
        tp = 1 if self.tp_group is None else dist.get_world_size(self.tp_group)
        seq_len = local_len * tp
        first = (self.microbatch * self.dp_degree + self.dp_rank) * rows
        self.microbatch += 1
        noise = torch.stack([self._sequence_noise(first + i, seq_len, dim, out.device) for i in range(rows)])
        if tp > 1:
            noise = noise.chunk(tp, dim=1)[dist.get_rank(self.tp_group)]
        return out + (noise * (self.alpha / math.sqrt(seq_len * dim))).to(out.dtype)


class ActiveForgetting(NoBaseline):
    """Re-initialises the token embeddings N(0, 0.02) before the step after every ``period`` steps (so
    checkpoints hold trained ones), zeroing the ``pad_id`` row as the authors' reset does, and clears
    their AdamW state."""

    def __init__(self, model: nn.Module, optimizers: Any, period: int, seed: int, tied: bool,
                 pad_id: int | None = None) -> None:  # fmt: skip
        self.embedding = model.tok_embeddings.weight
        self.optimizers, self.period, self.seed, self.pad_id = optimizers, period, seed, pad_id
        self.what = "token embeddings and the LM head tied to them" if tied else "token embeddings"

    def begin_step(self, step: int) -> None:
        if step > 1 and (step - 1) % self.period == 0:
            self.reset((step - 1) // self.period)
            logger.info(
                f"active forgetting: before step {step}: {self.what} re-initialised N(0, {INIT_STD}), "
                "AdamW state cleared"
            )

    @torch.no_grad()
    def reset(self, index: int) -> None:
        """One CPU draw of the full matrix (layout-free), this rank's shard kept; AdamW state zeroed."""
        generator = torch.Generator().manual_seed(mixed_seed(self.seed, index))
        full = torch.empty(self.embedding.shape, dtype=torch.float32).normal_(0.0, INIT_STD, generator=generator)
        if self.pad_id is not None and 0 <= self.pad_id < full.shape[0]:
            full[self.pad_id] = 0.0
        copy_full_into(self.embedding, full)
        for optimizer in self.optimizers:
            for value in optimizer.state.get(self.embedding, {}).values():
                value.zero_()


def build_baseline(
    cfg: Baseline,
    model: nn.Module,
    optimizers: Any,
    seed: int,
    tied: bool,
    pad_id: int | None = None,
    dp_rank: int = 0,
    dp_degree: int = 1,
    tp_group: dist.ProcessGroup | None = None,
) -> NoBaseline:
    """The ``[baseline]`` method's per-step behaviour for this trainer's model part (``pad_id``: the
    tokenizer's padding row, zeroed by each active-forgetting reset)."""
    if cfg.method == "noisy_embedding":
        return EmbeddingNoise(model.tok_embeddings, cfg.noise_alpha, seed, dp_rank, dp_degree, tp_group)
    if cfg.method == "active_forgetting":
        return ActiveForgetting(model, optimizers, cfg.forget_every, seed, tied, pad_id)
    return NoBaseline()
