"""Effective rank (Roy & Vetterli 2007) and maximum explainable variance (Ethayarajh 2019) of one
sequence's *unit* token matrix, so that they describe directions, like the cosine, whatever a few
huge-norm tokens do. σ² are the eigenvalues of the smaller float32 Gram matrix, diagonalised in
float64; those below its rounding noise, max(S, d)·ε₃₂·λ₁, count as 0. On a CPU the eigensolver runs
on one thread: LAPACK's threaded one was ten times slower at these sizes.
"""

from __future__ import annotations

import torch


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
    """[B, S, d] unit token vectors -> [B] exp(entropy of the normalised singular values)."""
    sigma = _eigenvalues(units).sqrt()
    p = sigma / sigma.sum(dim=-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))


def max_explainable_variance(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit token vectors -> [B] share of variance on the first principal component (1 for none)."""
    values = _eigenvalues(units - units.mean(dim=1, keepdim=True))
    total = values.sum(dim=-1)
    return torch.where(total > 0, values[..., -1] / total.clamp_min(torch.finfo(total.dtype).tiny), 1.0)
