"""What every implementation of the dispersion loss shares: the variants, their
parameters and ranges, the product precisions, and the per-sequence log-sum-exp.

The reference, the PyTorch strips (``dispersion.py``) and the Triton kernels
(``dispersion_triton.py``) all import from here, and from nothing of each other's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

# How the pair passes run: "triton" = the fused kernels of dispersion_triton.py (CUDA,
# or CPU under TRITON_INTERPRET=1), "torch" = the row strips of dispersion.py, "auto" =
# triton on CUDA (checked once per process against torch), else torch.
KERNELS = ("auto", "triton", "torch")

# The products of the Triton kernels (the torch strips always compute in fp32):
#   auto  - the default: tensor-core products with fp32 accumulation (bf16 today);
#   bf16  - rows and pair weights stored in bf16, bf16 tensor-core products;
#   tf32  - rows and pair weights in fp32, tf32 tensor-core products;
#   exact - fp32 rows and weights, bf16x3 products (ieee fp32 for l2_repel): the
#           reference's values within 1e-4 (value) and 2e-3 (gradient), relative.
PRECISIONS = ("auto", "bf16", "tf32", "exact")

# Guard for |z| (u = z / max(|z|, NORM_EPS)) and for the decorrelation std: zero
# vectors then give u = 0, a finite loss and a finite but large (~1/NORM_EPS) fp32
# gradient, which stays finite in bf16 but can overflow when cast to fp16.
NORM_EPS = 1e-6

LOG2 = math.log(2.0)

RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "tau": (lambda v: v > 0, "> 0"),
    "clamp": (lambda v: 0 < v < 1, "in (0, 1)"),
    "lambda_norm": (lambda v: v >= 0, ">= 0"),
    "max_tokens": (lambda v: v == 0 or v >= 2, "0 (all positions) or >= 2"),
}
"""Each numeric parameter's valid range: a predicate and how to say it (NaN fails every one)."""


def range_error(name: str, value: float, ranges: dict[str, tuple[Callable[[float], bool], str]] = RANGES) -> str | None:
    """``"must be <range>, got <value>"`` when ``value`` is outside parameter ``name``'s range."""
    valid, text = ranges[name]
    return None if valid(value) else f"must be {text}, got {value}"


class VariantSpec(NamedTuple):
    """How one variant is computed: which rows enter the Gram matrix, how pairs reduce."""

    name: str
    rows: str  # "unit": u = z / |z|; "centred": the same after subtracting the feature mean; "raw": z
    logsumexp: bool  # per sequence: log-mean-exp of the terms (True) or their mean (False)


SPECS = {
    spec.name: spec
    for spec in (
        VariantSpec("angular_spread", "unit", True),
        VariantSpec("orthogonalization", "unit", False),
        VariantSpec("l2_repel", "raw", True),
        VariantSpec("decorrelation", "centred", False),
    )
}
VARIANTS = tuple(SPECS)


class PairHyper(NamedTuple):
    """What the per-pair functions need besides the Gram matrix."""

    tau: float
    clamp: float
    pairs: int  # N (N - 1), the ordered pairs of one sequence


class OnlineLogSumExp:
    """Per-sequence log-sum-exp over strips or tiles: running max ``m`` and sum ``s`` of exp(x - m).

    The l2 logits -D/tau are unbounded below, so a fixed shift could underflow every
    term; a running max cannot. Backward takes p = exp((x - m) - log_s) rather than
    exp(x - lse): x - m is exact for the dominant terms, whereas lse can be O(1e3)
    for l2_repel, where one ulp of it is already a 1e-4 relative error in every p.
    """

    def __init__(self, batch: int, device: torch.device) -> None:
        self.m = torch.full((batch,), -math.inf, device=device)
        self.s = torch.zeros(batch, device=device)

    def add(self, logits: Tensor) -> None:
        """Fold in a strip [B, rows, cols] (masked entries -inf); consumes ``logits``."""
        m = torch.maximum(self.m, logits.amax(dim=(1, 2)))
        self.s = self.s * torch.exp(self.m - m) + logits.sub_(m[:, None, None]).exp_().sum(dim=(1, 2))
        self.m = m

    def add_partials(self, m_part: Tensor, s_part: Tensor) -> None:
        """Fold in per-tile results [B, tiles]: maxima and sums of exp(x - max) (empty tiles: -inf, 0)."""
        m = torch.maximum(self.m, m_part.amax(dim=1))
        self.s = self.s * torch.exp(self.m - m) + (s_part * torch.exp(m_part - m[:, None])).sum(dim=1)
        self.m = m

    def finish(self) -> tuple[Tensor, Tensor]:
        """(m, log_s) of the sum over ordered pairs: each strip holds only i < j, hence + log 2."""
        return self.m, self.s.log() + LOG2
