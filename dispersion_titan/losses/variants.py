"""What every implementation of the dispersion loss shares: the variants, their
parameters and ranges, the product precisions, the per-sequence log-sum-exp, and
the autograd Function around a pair kernel's two passes.

The reference, the PyTorch strips (``dispersion.py``) and the Triton kernels
(``dispersion_triton.py``) all import from here, and from nothing of each other's.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor

# How the pair passes run: "triton" = the fused kernels of dispersion_triton.py (CUDA,
# or CPU under TRITON_INTERPRET=1), "torch" = the row strips of dispersion.py, "auto" =
# triton on CUDA (checked once per process against torch), else torch.
KERNELS = ("auto", "triton", "torch")

# The products of the Triton kernels (the torch strips always compute in fp32):
#   auto  - the default: tensor-core products with fp32 accumulation (bf16 today); for
#           perplexity_entropy split-precision bf16x3 logits (rows stored as bf16 hi and lo parts),
#           as its sharp row softmaxes amplify bf16 distance errors, and a bf16 W U;
#   bf16  - rows and pair weights stored in bf16, bf16 tensor-core products;
#   tf32  - rows in fp32, tf32 tensor-core pair products; W in bf16 hi and lo parts, W U exact
#           to fp32 accumulation (four bf16 products);
#   exact - rows in bf16 hi and lo parts and bf16x3 pair products (fp32 rows and ieee fp32
#           products for the raw-row variants), W U as for tf32: the reference's values within
#           1e-4 (value) and 2e-3 (gradient), relative.
PRECISIONS = ("auto", "bf16", "tf32", "exact")

# perplexity_entropy's sharp row softmaxes need fp32 logits: bf16 and tf32 products put 22% and
# 7% into its gradient at GPT-2 small's shape (bench/check_kernel_cuda.py, H200, 2026-11-25).
ROW_ENTROPY_PRECISIONS = ("auto", "exact")

# Guard for |z| (u = z / max(|z|, NORM_EPS)) and for the decorrelation std: zero
# vectors then give u = 0, a finite loss and a finite but large (~1/NORM_EPS) fp32
# gradient, which stays finite in bf16 but can overflow when cast to fp16.
NORM_EPS = 1e-6

LOG2 = math.log(2.0)

# The smallest temperature: every variant's loss and gradient stay finite down to it (test_dispersion_loss).
TAU_MIN = 1e-30

# Which formulas: "released" = the authors' lm_dispersion/dispersion.py (DispersionLoss, which
# produced the paper's numbers): u = z / (|z| + 1e-2), every logit + 1e-2, l2_repel's normaliser
# over all N^2 pairs (the diagonal's N terms exp(0) included), perplexity_entropy's log2(p + 1e-2);
# "paper" = the paper's equations: u = z / |z|, pairs i != j only, log2(p).
FORMS = ("released", "paper")

RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "tau": (lambda v: v >= TAU_MIN, f">= {TAU_MIN} (fp32's 1/tau is infinite below about 3e-39: a NaN loss)"),
    "clamp": (
        lambda v: 1e-6 <= v < 1,
        "in [1e-6, 1) (fp32 clamps no closer to ±1: 1 - 1e-9 rounds to 1, where arccos's slope is infinite)",
    ),
    "lambda_norm": (lambda v: v >= 0, ">= 0"),
    "max_tokens": (
        lambda v: isinstance(v, numbers.Integral) and (v == 0 or v >= 2),
        "an integer, 0 (all positions) or >= 2",
    ),
}
"""Each numeric parameter's valid range: a predicate and how to say it (the loss refuses inf and NaN first)."""


def row_norm(x: Tensor) -> Tensor:
    """|x| over the last dimension (kept), through x / max|x| so that the squares cannot overflow: fp32's
    sum of squares is infinite from |x| ~ 1.8e19, which made such tokens zero vectors (u = x / inf). The
    scale is a constant to autograd: |x / s|·s is |x| for any s > 0, so its gradient through s is zero, and
    differentiating it made the normalisation 4x a plain norm's forward and backward on a CPU (bench/row_norm.py)."""
    with torch.no_grad():
        scale = x.abs().amax(dim=-1, keepdim=True)
        scale = torch.where(scale > 0, scale, 1.0)
    return (x / scale).norm(dim=-1, keepdim=True) * scale


def precision_error(variant: str, precision: str) -> str | None:
    """Why ``precision`` cannot compute ``variant`` to the kernel's tolerances, or None."""
    if precision not in PRECISIONS:
        return f"must be one of {PRECISIONS}, got {precision!r}"
    if variant in SPECS and SPECS[variant].row_entropy and precision not in ROW_ENTROPY_PRECISIONS:
        return (
            f"{variant} runs at {' or '.join(ROW_ENTROPY_PRECISIONS)} only ({precision} products put up to "
            f"22% into its gradient), got {precision!r}"
        )
    return None


GramRows = Literal["unit", "centred", "raw"]
"""Which rows enter the Gram matrix: "unit" u = z / |z|; "centred" the same after subtracting
the feature mean; "raw" z itself, whose pairs are squared distances D = |z_i|^2 + |z_j|^2 - 2 g."""


class VariantSpec(NamedTuple):
    """How one variant is computed: which rows enter the Gram matrix, how pairs reduce. The
    torch strips and the Triton kernels read these fields, never the variant's name, for
    everything but the variant's own pair term and its gradient."""

    name: str
    rows: GramRows
    logsumexp: bool  # per sequence: log-mean-exp of the terms (True) or their mean (False)
    row_entropy: bool = False  # per token: the entropy of the softmax of its row (perplexity_entropy)
    norm_penalty: bool = False  # + lambda_norm * mean(z^2) (l2_repel)

    def guard(self, d: int) -> float:
        """The guard of u = x / max(|x|, guard): NORM_EPS, or for decorrelation's centred rows sqrt(d-1)
        NORM_EPS, so that u_i . u_j is the correlation with the std clamped at NORM_EPS."""
        return NORM_EPS * math.sqrt(d - 1) if self.rows == "centred" else NORM_EPS


SPECS = {
    spec.name: spec
    for spec in (
        VariantSpec("angular_spread", "unit", True),
        VariantSpec("orthogonalization", "unit", False),
        VariantSpec("l2_repel", "raw", True, norm_penalty=True),
        VariantSpec("decorrelation", "centred", False),
        VariantSpec("perplexity_entropy", "raw", False, row_entropy=True),
    )
}
VARIANTS = tuple(SPECS)


class PairHyper(NamedTuple):
    """What the per-pair functions need besides the Gram matrix."""

    tau: float  # also sigma^2 of perplexity_entropy, as the released code's tau_l2
    clamp: float
    pairs: int  # N (N - 1), the ordered pairs of one sequence
    form: str = "released"  # one of FORMS

    @property
    def eps(self) -> float:
        """The released code's ``epsilon`` (DispersionLoss.__init__, lm_dispersion/dispersion.py: norm guard,
        logit shift, entropy's log), 0 for the paper's form."""
        return 1e-2 if self.form == "released" else 0.0

    def unit_eps(self, spec: VariantSpec) -> float:
        """What is added to |z| for unit rows: the released z / (|z| + eps); 0 for other rows."""
        return self.eps if spec.rows == "unit" else 0.0


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

    def finish(self, spec: VariantSpec, hp: PairHyper, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """A log-sum-exp variant's per-sequence value, and the (m, log_s) of its sum over ordered pairs:
        each strip holds only i < j, hence + log 2. The released form adds eps to every logit and, for
        l2_repel, the N terms of logit 0 of the pairs i = j (D_ii = 0), its mean over N^2 pairs."""
        if spec.rows != "raw" or hp.form != "released":
            m, log_s = self.m, self.s.log() + LOG2
            return m + log_s - math.log(hp.pairs) + hp.eps, m, log_s
        m = self.m.clamp_min(0.0)
        log_s = torch.log(2.0 * self.s * torch.exp(self.m - m) + n * torch.exp(-m))
        return m + log_s - math.log(hp.pairs) + (hp.eps + (math.log(hp.pairs) - 2 * math.log(n))), m, log_s


class PairLoss(torch.autograd.Function):
    """Every pair kernel's autograd Function: ``kernel.forward`` gives the per-sequence loss and what its
    ``backward`` (the layers' gradients, by a recomputing pass) needs, two scalars per sequence or three per
    token, saved with the layers and nothing else. Autocast is off inside: fp32 whatever the caller's."""

    @staticmethod
    def forward(ctx, spec: VariantSpec, hp: PairHyper, lambda_norm: float, kernel: Any, *layers: Tensor) -> Tensor:
        with torch.autocast(layers[0].device.type, enabled=False):
            per_seq, saved = kernel.forward(layers, spec, hp, lambda_norm)
            ctx.spec, ctx.hp, ctx.lambda_norm, ctx.kernel, ctx.layers = spec, hp, lambda_norm, kernel, len(layers)
            ctx.save_for_backward(*layers, *saved)
            return per_seq.mean()

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        # the analytic gradient has no graph: a second derivative through it would silently be zero
        if torch.is_grad_enabled():
            raise RuntimeError(
                "dispersion_loss is differentiable once: its backward cannot build a graph (create_graph=True, "
                "double backward, torch.func.hessian); use dispersion_loss_reference for higher derivatives"
            )
        layers, saved = ctx.saved_tensors[: ctx.layers], ctx.saved_tensors[ctx.layers :]
        with torch.autocast(layers[0].device.type, enabled=False):
            dz = ctx.kernel.backward(layers, saved, grad_out, ctx.spec, ctx.hp, ctx.lambda_norm)
        return None, None, None, None, *dz


def row_entropy_terms(p: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """f(p) = p log2(p + eps) and p f'(p), f'(p) = log2(p + eps) + p / ((p + eps) ln 2); 0 where p = 0,
    NaN where p is (a NaN hidden state's row must not read as a finite loss).

    perplexity_entropy's loss is the mean over tokens i of sum_j f(p_ij); its gradient needs
    a_i = sum_j p_ij f'(p_ij). The torch strips use this; the Triton kernel has it in Triton.
    """
    log = torch.log2(p + eps)
    f = torch.where(p == 0, 0.0, p * log)
    pf = torch.where(p == 0, 0.0, p * (log + p / ((p + eps) * LOG2)))
    return f, pf
