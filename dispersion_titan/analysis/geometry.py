"""Effective rank and maximum explainable variance of one sequence's token matrix.

Both are measured on the *unit* token matrix Û (each token's hidden state divided by its
norm, as for the cosine), so they describe directions, like the cosine, and are not
dominated by the few tokens with huge norms that many models have (GPT-2's first
position, Llama's attention sinks):

- ``effective_rank`` (Roy & Vetterli 2007): exp(−Σ p_i log p_i), p_i = σ_i / Σ_j σ_j,
  σ the singular values of Û (S × d). 1 when every token points along one line, min(S, d)
  for orthogonal tokens.
- ``mev``, maximum explainable variance (Ethayarajh 2019, there over the occurrences of
  one word; here over the tokens of one sequence): σ_1(Û_c)² / Σ_i σ_i(Û_c)², Û_c = Û
  minus its mean token, i.e. the share of the tokens' variance on their first principal
  component. A sequence whose tokens all point the same way has no variance; it counts
  as 1.

σ² are the eigenvalues of the smaller Gram matrix (S × S or d × d), formed in float32
like the cosines and diagonalised in float64, batched. The float32 Gram carries
rounding noise of about max(S, d)·ε₃₂·λ₁ on every eigenvalue, which the square root
would turn into spurious singular values of about √(that) and inflate the entropy; so
eigenvalues below that floor count as 0. On a CPU the eigensolver runs on one thread:
LAPACK's threaded symmetric eigensolver was ten times slower than one thread at these
sizes (S = 256, 2-core VM).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _gram(x: torch.Tensor) -> torch.Tensor:
    """[B, S, d] -> the smaller of x xᵀ and xᵀ x (same nonzero eigenvalues), as float64."""
    x = x.float()
    return (x @ x.mT if x.shape[1] <= x.shape[2] else x.mT @ x).double()


def _eigenvalues(x: torch.Tensor) -> torch.Tensor:
    """Squared singular values of each [S, d] matrix, ascending, rounding noise zeroed."""
    gram = _gram(x)
    with _one_cpu_thread(gram.device):
        values = torch.linalg.eigvalsh(gram)
    tolerance = max(x.shape[1:]) * torch.finfo(torch.float32).eps * values[..., -1:].clamp_min(0)
    return torch.where(values > tolerance, values, torch.zeros_like(values))


def effective_rank(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit token vectors -> [B] effective ranks."""
    sigma = _eigenvalues(units).sqrt()
    p = sigma / sigma.sum(dim=-1, keepdim=True)
    return torch.exp(-torch.special.xlogy(p, p).sum(dim=-1))


def max_explainable_variance(units: torch.Tensor) -> torch.Tensor:
    """[B, S, d] unit token vectors -> [B] share of variance on the first principal component."""
    values = _eigenvalues(units - units.mean(dim=1, keepdim=True))
    total = values.sum(dim=-1)
    return torch.where(total > 0, values[..., -1] / total.clamp_min(torch.finfo(total.dtype).tiny), 1.0)
