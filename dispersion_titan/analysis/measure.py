"""Per-layer S×S cosine matrices, averaged over sequences while the forward pass runs.

Each layer's hidden states are reduced as soon as ``GPT2.hidden_states`` yields them
(one batched matmul per layer and batch) into a running sum, so memory is L×S×S plus
one batch's activations whatever the number of sequences K, and the LM head is never
computed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..models.gpt2.model import GPT2

# Token vectors are divided by max(|h|, NORM_CLAMP) (the paper's clamp).
NORM_CLAMP = 1e-3


def cosine_matrices(hidden: torch.Tensor) -> torch.Tensor:
    """[B, S, d] -> [B, S, S] fp32 cosines, clipped to [-1, 1] (rounding can exceed 1)."""
    h = hidden.float()
    u = h / h.norm(dim=-1, keepdim=True).clamp_min(NORM_CLAMP)
    return torch.bmm(u, u.transpose(1, 2)).clamp_(-1.0, 1.0)


class CosineSums:
    """Running element-wise sums over sequences of every layer's cosine matrix."""

    def __init__(self, num_layers: int, seq_len: int, device: torch.device | str):
        self.sums = torch.zeros(num_layers, seq_len, seq_len, device=device)
        self.names: list[str] = []
        self.count = 0

    @torch.inference_mode()
    def add_batch(self, model: GPT2, tokens: torch.Tensor) -> None:
        """Run one batch [B, S] through the model, reducing each layer on the fly."""
        names = []
        for index, (name, hidden) in enumerate(model.hidden_states(tokens.to(self.sums.device))):
            self.sums[index] += cosine_matrices(hidden).sum(dim=0)
            names.append(name)
        self.names = names
        self.count += tokens.shape[0]

    def means(self) -> torch.Tensor:
        """[L, S, S] element-wise mean over the sequences seen."""
        return self.sums / self.count


def mean_cosine_matrices(model: GPT2, tokens: torch.Tensor, batch_size: int, device: torch.device | str,
                         on_batch: Callable[[], None] = lambda: None) -> tuple[list[str], torch.Tensor]:
    """Layer names and the [L, S, S] cosine matrices averaged over the K sequences."""
    num_layers = model.model_args.n_layers + 2  # embedding, blocks, final norm
    sums = CosineSums(num_layers, tokens.shape[1], device)
    for batch in tokens.split(batch_size):
        sums.add_batch(model, batch)
        on_batch()
    return sums.names, sums.means()
