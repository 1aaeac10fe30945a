"""Per-layer S×S cosine matrices, reduced into running sums as each layer's hidden states arrive (memory
L×S×S whatever K; no LM head), and the geometry of ``geometry_sequences`` evenly spaced sequences:
each costs about a forward pass (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..utils.errors import CheckpointError
from . import DEFAULT_GEOMETRY_SEQUENCES

# Token vectors are divided by max(|h|, NORM_CLAMP) (the paper's clamp).
NORM_CLAMP = 1e-3


class _FinalNormReached(Exception):
    """Raised by the final norm's hook: the rest of the forward (the LM head) is not needed."""


class DecoderLayers:
    """A run's model as the analysis reads it, through forward hooks: ``embedding`` is the first block's input,
    ``block_i`` block i's output, ``final_norm`` the final norm's, where the forward stops (no LM head)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.blocks = list(model.layers.values())
        self.input_device = model.tok_embeddings.weight.device

    def final_norm(self, tokens: torch.Tensor) -> torch.Tensor:
        """The final norm's output, the LM head left out."""
        output = []

        def stop(_module: nn.Module, _args: Any, hidden: torch.Tensor) -> None:
            output.append(hidden)
            raise _FinalNormReached

        hook = self.model.norm.register_forward_hook(stop)
        try:
            self.model(tokens)
        except _FinalNormReached:
            pass
        finally:
            hook.remove()
        return output[0]

    def run(self, tokens: torch.Tensor, sink: Callable[[str, torch.Tensor], None]) -> None:
        """Hand each layer's hidden states [B, S, d] to ``sink``, in depth order."""

        def embedding(_module: nn.Module, args: Any, kwargs: dict) -> None:
            sink("embedding", args[0] if args else kwargs["hidden_states"])

        def block(name: str) -> Callable:
            return lambda _module, _args, output: sink(name, output[0] if isinstance(output, tuple) else output)

        hooks = [self.blocks[0].register_forward_pre_hook(embedding, with_kwargs=True)]
        hooks += [b.register_forward_hook(block(f"block_{i}")) for i, b in enumerate(self.blocks, start=1)]
        try:
            final = self.final_norm(tokens)
        finally:
            for hook in hooks:
                hook.remove()
        sink("final_norm", final)


def unit_tokens(hidden: torch.Tensor) -> torch.Tensor:
    """[B, S, d] -> fp32 token vectors divided by their norm clamped at ``NORM_CLAMP``; NaN where a norm is not
    finite (NaN or infinite hidden states of a diverged or damaged model, or past float32), for ``refuse_nan``."""
    h = hidden.float()
    norm = h.norm(dim=-1, keepdim=True)
    return h / torch.where(norm.isfinite(), norm.clamp_min(NORM_CLAMP), torch.nan)


def refuse_nan(values: torch.Tensor) -> None:
    """CheckpointError where ``values`` (made of ``unit_tokens``) hold a NaN: the eigensolver fails on them, the
    cosines would be NaN. Reads one value back: on CUDA, a wait for the GPU."""
    if not values.isfinite().all():
        raise CheckpointError("its hidden states are NaN, infinite or too large for float32")


def cosines(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit vectors -> [B, S, S] cosines, clipped to [-1, 1] (rounding can exceed 1)."""
    return torch.bmm(units, units.transpose(1, 2)).clamp_(-1.0, 1.0)


def geometry_mask(num_sequences: int, geometry_sequences: int) -> torch.Tensor:
    """[K] bool: the ``geometry_sequences`` evenly spaced sequences (all if K is fewer)."""
    mask = torch.zeros(num_sequences, dtype=torch.bool)
    count = min(num_sequences, geometry_sequences)
    mask[torch.linspace(0, num_sequences - 1, count).round().long()] = True
    return mask


# Effective rank (Roy & Vetterli 2007) and maximum explainable variance (Ethayarajh 2019) of one sequence's
# *unit* token matrix, so that they describe directions, like the cosine, whatever a few huge-norm tokens do.
# σ² are the eigenvalues of the smaller float32 Gram matrix, diagonalised in float64; those below its rounding
# noise, max(S, d)·ε₃₂·λ₁, count as 0. On a CPU the eigensolver runs on one thread: LAPACK's threaded one was
# ten times slower at these sizes.
def _eigenvalues(x: torch.Tensor) -> torch.Tensor:
    """Squared singular values of each [S, d] matrix, ascending, rounding noise zeroed: the eigenvalues of
    the smaller of x xᵀ and xᵀ x (same nonzero eigenvalues)."""
    single = x.float()
    gram = (single @ single.mT if x.shape[1] <= x.shape[2] else single.mT @ single).double()
    threads = torch.get_num_threads()
    if gram.device.type == "cpu":
        torch.set_num_threads(1)
    try:
        values = torch.linalg.eigvalsh(gram)
    finally:
        torch.set_num_threads(threads)
    tolerance = max(x.shape[1:]) * torch.finfo(torch.float32).eps * values[..., -1:].clamp_min(0)
    return torch.where(values > tolerance, values, torch.zeros_like(values))


def effective_rank(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit token vectors -> [B] exp(entropy of the normalised singular values); 0 for a sequence
    whose tokens are all zero (no direction: the normalisation would be 0 / 0)."""
    sigma = _eigenvalues(units).sqrt()
    total = sigma.sum(dim=-1, keepdim=True)
    p = sigma / total.clamp_min(torch.finfo(total.dtype).tiny)
    return torch.where(total[..., 0] > 0, torch.exp(-torch.special.xlogy(p, p).sum(dim=-1)), 0.0)


def max_explainable_variance(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit token vectors -> [B] share of variance on the first principal component (1 for none)."""
    values = _eigenvalues(units - units.mean(dim=1, keepdim=True))
    total = values.sum(dim=-1)
    return torch.where(total > 0, values[..., -1] / total.clamp_min(torch.finfo(total.dtype).tiny), 1.0)


@dataclass(frozen=True)
class Measurement:
    names: list[str]
    means: torch.Tensor
    """[L, S, S] element-wise mean cosine matrices over the K sequences."""
    effective_rank: list[float]
    mev: list[float]
    geometry_sequences: int


def measure(
    model: DecoderLayers,
    tokens: torch.Tensor,
    batch_size: int,
    device: torch.device | str,
    geometry_sequences: int = DEFAULT_GEOMETRY_SEQUENCES,
    on_batch: Callable[[], None] = lambda: None,
) -> Measurement:
    """Mean cosine matrices over the K sequences of ``tokens`` [K, S], and mean geometry: running sums over the
    sequences of every layer's, reduced as its hidden states arrive."""
    num_layers = len(model.blocks) + 2  # embedding, blocks, final norm
    sums = torch.zeros(num_layers, tokens.shape[1], tokens.shape[1], device=device)
    rank_sums = torch.zeros(num_layers, dtype=torch.float64, device=device)
    mev_sums = torch.zeros_like(rank_sums)
    geometry = geometry_mask(len(tokens), geometry_sequences)
    names: list[str] = []  # the layers of the batch being run, in depth order
    rows: list[int] = []  # its sequences whose geometry is measured

    def sink(name: str, hidden: torch.Tensor) -> None:
        index = len(names)
        u = unit_tokens(hidden)
        sums[index] += cosines(u).sum(dim=0).to(sums.device)
        if rows:
            chosen = u[rows]
            refuse_nan(chosen)  # before the eigensolver, which fails on it
            rank_sums[index] += effective_rank(chosen).sum().to(sums.device)
            mev_sums[index] += max_explainable_variance(chosen).sum().to(sums.device)
        names.append(name)

    for start in range(0, len(tokens), batch_size):
        batch = tokens[start : start + batch_size]
        rows = geometry[start : start + len(batch)].nonzero().flatten().tolist()
        names.clear()
        with torch.inference_mode():
            model.run(batch.to(model.input_device), sink)
        refuse_nan(sums)  # once per batch, not per layer: each check waits for the GPU
        on_batch()
    chosen = len(geometry.nonzero())  # the mask's count, by its shape (no value read back)
    per_layer = (lambda total: (total / chosen).tolist()) if chosen else (lambda total: [None] * len(total))
    return Measurement(list(names), sums / len(tokens), per_layer(rank_sums), per_layer(mev_sums), chosen)
