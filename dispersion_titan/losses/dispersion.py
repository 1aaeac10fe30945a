"""Dispersion losses on per-block hidden states, plus a cheap condensation probe.

A dispersion loss pushes the token representations of one sequence apart so the
residual stream does not condense into a narrow cone. Every variant is a function
of the pairwise geometry of the N tokens of a sequence, i.e. of an N x N matrix.
Autograd on the obvious implementation (``dispersion_loss_reference``) keeps
several [B, N, N] fp32 matrices alive per hooked block until backward, which at
GPT-2 sizes (B=8, N=1024, 12 blocks) is gigabytes.

``dispersion_loss`` computes the same values with custom autograd Functions that
save only their input (plus two scalars per sequence), walk the upper triangle of
the pair matrix in row strips (so a temporary is [B, rows, N], never [B, N, N]),
and recompute the strips in backward with analytic gradients.

Notation: u_i = z_i / max(|z_i|, eps), c_ij = u_i . u_j, D_ij = arccos(c_ij) / pi
for the angular variants; "i != j" runs over the N(N-1) ordered pairs of one
sequence; the returned value is the mean over the B sequences.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

VARIANTS = ("angular_spread", "orthogonalization", "l2_repel", "decorrelation")

# Guard for |z| (u = z / max(|z|, NORM_EPS)) and for the decorrelation std: zero
# vectors then give u = 0, a finite loss and a finite but large (~1/NORM_EPS) fp32
# gradient, which stays finite in bf16 but can overflow when cast to fp16.
NORM_EPS = 1e-6

# Budget for the strip temporaries of the lean implementation; the rows per strip
# are chosen so that one [B, rows, N] fp32 buffer stays within it. Tests shrink it
# to force many strips.
MAX_BLOCK_BYTES = 32 * 2**20

# Upper bound on the rows per strip. Strips over the upper triangle only skip the
# lower triangle between strips, so at least a few strips are needed to roughly
# halve the elementwise work; more strips mean smaller, slower matmuls.
MAX_BLOCK_ROWS = 128

_LOG2 = math.log(2.0)


def _validate(hidden: Tensor, variant: str, tau: float, clamp: float, max_tokens: int) -> None:
    """Reject arguments that would silently give a meaningless loss."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    if not 0 < clamp < 1:
        raise ValueError(f"clamp must be in (0, 1), got {clamp}")
    if max_tokens < 0 or max_tokens == 1:
        raise ValueError(f"max_tokens must be 0 (all positions) or >= 2, got {max_tokens}")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, N, d], got shape {tuple(hidden.shape)}")
    if not hidden.is_floating_point():
        raise ValueError(f"hidden must be a floating-point tensor, got {hidden.dtype}")
    if variant == "decorrelation" and hidden.shape[-1] < 2:
        raise ValueError("hidden needs d >= 2 for decorrelation (the std divides by d - 1)")


def _select_tokens(hidden: Tensor, max_tokens: int, generator: torch.Generator | None) -> Tensor:
    """Subsample positions uniformly, the same subset for every sequence of the batch.

    The cost is quadratic in N, so long sequences are subsampled; sharing the subset
    keeps the draw a single ``randperm`` the caller can make reproducible.
    """
    n = hidden.shape[1]
    if max_tokens == 0 or max_tokens >= n:
        return hidden
    device = generator.device if generator is not None else torch.device("cpu")
    idx = torch.randperm(n, generator=generator, device=device)[:max_tokens]
    return hidden.index_select(1, idx.to(hidden.device))


def _no_pair_loss(z: Tensor, variant: str, lambda_norm: float) -> Tensor:
    """Loss for N < 2: no pairs, so 0 (plus the norm penalty of l2_repel), still on the graph."""
    loss = z.sum() * 0.0
    if variant == "l2_repel" and z.shape[1] > 0:
        loss = loss + lambda_norm * z.square().mean(dim=(1, 2)).mean()
    return loss


def dispersion_loss_reference(
    hidden: Tensor,
    variant: str,
    *,
    tau: float = 1.0,
    clamp: float = 0.1,
    lambda_norm: float = 0.1,
    max_tokens: int = 0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Naive dispersion loss: materialises the [B, N, N] matrices and lets autograd differentiate.

    Same contract as ``dispersion_loss``; kept as the readable definition that tests
    and ``bench/dispersion_loss.py`` compare the memory-lean version against.
    """
    _validate(hidden, variant, tau, clamp, max_tokens)
    z = _select_tokens(hidden, max_tokens, generator).float()
    _, n, d = z.shape
    if n < 2:
        return _no_pair_loss(z, variant, lambda_norm)
    pairs = n * (n - 1)
    diag = torch.eye(n, dtype=torch.bool, device=z.device)

    if variant == "decorrelation":
        zc = z - z.mean(dim=-1, keepdim=True)
        zc = zc / zc.std(dim=-1, keepdim=True).clamp_min(NORM_EPS)
        corr = zc @ zc.transpose(1, 2) / (d - 1)
        per_seq = corr.square().masked_fill(diag, 0.0).sum(dim=(1, 2)) / pairs
    elif variant == "l2_repel":
        sq = z.square().sum(dim=-1)
        dist = sq[:, :, None] + sq[:, None, :] - 2 * (z @ z.transpose(1, 2))
        logits = (-dist / tau).masked_fill(diag, -math.inf)
        per_seq = (
            torch.logsumexp(logits, dim=(1, 2))
            - math.log(pairs)
            + lambda_norm * z.square().mean(dim=(1, 2))
        )
    else:
        u = z / z.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)
        cos = u @ u.transpose(1, 2)
        # Straight-through clamp: arccos sees the clamped value (finite slope), and
        # its gradient reaches cos unchanged even where cos was outside the range.
        cos_st = cos + (cos.clamp(-1 + clamp, 1 - clamp) - cos).detach()
        ang = torch.arccos(cos_st) / math.pi
        if variant == "angular_spread":
            logits = (-ang / tau).masked_fill(diag, -math.inf)
            per_seq = torch.logsumexp(logits, dim=(1, 2)) - math.log(pairs)
        else:
            per_seq = torch.relu(0.5 - ang).square().masked_fill(diag, 0.0).sum(dim=(1, 2)) / pairs
    return per_seq.mean()


# ----------------------------------------------------------------------------------
# Memory-lean implementation
# ----------------------------------------------------------------------------------


def _strips(n: int, batch: int) -> Iterator[tuple[int, int]]:
    """Row ranges [r0, r1) covering rows 0..n-2 (row n-1 has no pair above the diagonal).

    Strip [r0, r1) is paired with columns [r0, n), so every strip holds at least one
    strict-upper-triangle pair and its temporaries are [batch, r1 - r0, n - r0].
    """
    rows = max(1, min(MAX_BLOCK_ROWS, MAX_BLOCK_BYTES // (4 * batch * n)))
    for r0 in range(0, n - 1, rows):
        yield r0, min(r0 + rows, n - 1)


def _mask_lower(buf: Tensor, rows: int, fill: float) -> Tensor:
    """Blank the diagonal and below in a strip's leading [rows, rows] block (in place)."""
    lower = torch.ones(rows, rows, dtype=torch.bool, device=buf.device).tril_()
    buf[:, :, :rows].masked_fill_(lower, fill)
    return buf


class _OnlineLogSumExp:
    """Per-sequence log-sum-exp over strips: running max ``m`` and sum ``s`` of exp(x - m).

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

    def finish(self) -> tuple[Tensor, Tensor]:
        """(m, log_s) of the sum over ordered pairs: each strip holds only i < j, hence + log 2."""
        return self.m, self.s.log() + _LOG2


def _softmax_(logits: Tensor, m: Tensor, log_s: Tensor) -> Tensor:
    """p_ij = exp(x_ij - lse) of one strip, in place, in the precise form (x - m) - log_s."""
    return logits.sub_(m[:, None, None]).sub_(log_s[:, None, None]).exp_()


def _unit_rows(hidden: Tensor, center: bool) -> tuple[Tensor, Tensor, float]:
    """fp32 u = x / max(|x|, guard) with x = z (or z minus its feature mean); also |x| and guard.

    For decorrelation (``center``) the guard is sqrt(d-1) * NORM_EPS, so u_i . u_j is
    exactly the reference's C_ij = z_c,i . z_c,j / (d-1) with the std clamped at NORM_EPS.
    """
    x = hidden.float()
    guard = NORM_EPS
    if center:
        x = x - x.mean(dim=-1, keepdim=True)
        guard = NORM_EPS * math.sqrt(x.shape[-1] - 1)
    norm = x.norm(dim=-1, keepdim=True).clamp_min(guard)
    return x / norm, norm, guard


class _CosinePairLoss(torch.autograd.Function):
    """angular_spread, orthogonalization and decorrelation: functions of c_ij = u_i . u_j.

    Saves only ``hidden`` (and, for angular_spread, two scalars per sequence); backward
    recomputes u and the strips. Each unordered pair is visited once, so dL/dc of a
    pair covers both (i, j) and (j, i), and dL/du = (G + G^T) u is accumulated as
    du_rows += G u_cols, du_cols += G^T u_rows.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, variant: str, tau: float, clamp: float) -> Tensor:
        u, _, _ = _unit_rows(hidden, center=variant == "decorrelation")
        b, n, _ = u.shape
        pairs = n * (n - 1)
        lse = _OnlineLogSumExp(b, u.device)
        total = torch.zeros(b, device=u.device)  # sum over i < j of the pair term
        for r0, r1 in _strips(n, b):
            buf = torch.bmm(u[:, r0:r1], u[:, r0:].transpose(1, 2))
            if variant == "decorrelation":
                total += _mask_lower(buf.square_(), r1 - r0, 0.0).sum(dim=(1, 2))
                continue
            buf.clamp_(-1 + clamp, 1 - clamp).arccos_()  # pi * D
            if variant == "angular_spread":
                lse.add(_mask_lower(buf.mul_(-1.0 / (math.pi * tau)), r1 - r0, -math.inf))
            else:
                buf.mul_(-1.0 / math.pi).add_(0.5).clamp_min_(0.0).square_()
                total += _mask_lower(buf, r1 - r0, 0.0).sum(dim=(1, 2))
        ctx.variant, ctx.tau, ctx.clamp = variant, tau, clamp
        if variant == "angular_spread":
            m, log_s = lse.finish()
            ctx.save_for_backward(hidden, m, log_s)
            per_seq = m + log_s - math.log(pairs)
        else:
            ctx.save_for_backward(hidden)
            per_seq = 2.0 * total / pairs
        return per_seq.mean()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, *lse = ctx.saved_tensors
        variant, tau, clamp = ctx.variant, ctx.tau, ctx.clamp
        u, norm, guard = _unit_rows(hidden, center=variant == "decorrelation")
        b, n, _ = u.shape
        pairs = n * (n - 1)
        du = torch.zeros_like(u)
        for r0, r1 in _strips(n, b):
            u_rows, u_cols = u[:, r0:r1], u[:, r0:]
            weight = torch.bmm(u_rows, u_cols.transpose(1, 2))  # becomes dL/dc per pair
            if variant == "decorrelation":
                weight.mul_(4.0 / pairs)  # L = (2 / pairs) sum_{i<j} c^2
            else:
                cos = weight.clamp_(-1 + clamp, 1 - clamp)
                weight = torch.arccos(cos)  # pi * D
                # -dD/dc = 1 / (pi sqrt(1 - c^2)) at the clamped c: the straight-through gradient
                slope = cos.square_().neg_().add_(1.0).rsqrt_().mul_(1.0 / math.pi)
                if variant == "angular_spread":
                    # L = log sum_{i!=j} exp(-D / tau) - const  ->  dL/dc = 2 p_ij / tau * (-dD/dc)
                    _softmax_(weight.mul_(-1.0 / (math.pi * tau)), *lse).mul_(slope).mul_(2.0 / tau)
                else:
                    # L = (2 / pairs) sum_{i<j} relu(1/2 - D)^2  ->  dL/dc = (4 / pairs) relu(1/2 - D) (-dD/dc)
                    weight.mul_(-1.0 / math.pi).add_(0.5).clamp_min_(0.0).mul_(slope).mul_(4.0 / pairs)
                del cos, slope
            _mask_lower(weight, r1 - r0, 0.0)
            du[:, r0:r1].baddbmm_(weight, u_cols)
            du[:, r0:].baddbmm_(weight.transpose(1, 2), u_rows)
            del weight
        du.mul_(grad_out / b)
        # Through u = x / max(|x|, guard): drop the radial part unless |x| was clamped.
        # For decorrelation x = z - mean(z), whose backward would subtract the feature
        # mean of dx; that mean is already 0, as du and u are combinations of centred rows.
        radial = (u * du).sum(dim=-1, keepdim=True).masked_fill_(norm <= guard, 0.0)
        dx = du.sub_(u.mul_(radial)).div_(norm)
        return dx.to(hidden.dtype), None, None, None


def _l2_logits(z: Tensor, sq: Tensor, r0: int, r1: int, tau: float) -> Tensor:
    """-D / tau for strip rows [r0, r1) x columns [r0, N), D = (s_i + s_j) - 2 z_i . z_j.

    Same operation order as the reference, so both round identically.
    """
    gram = torch.bmm(z[:, r0:r1], z[:, r0:].transpose(1, 2))
    dist = sq[:, r0:r1, None] + sq[:, None, r0:]
    return dist.sub_(gram, alpha=2.0).div_(-tau)


class _L2RepelLoss(torch.autograd.Function):
    """l2_repel on raw z: log-mean-exp of -|z_i - z_j|^2 / tau plus lambda * mean(z^2).

    Saves ``hidden`` and two scalars per sequence; backward recomputes the strips.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, tau: float, lambda_norm: float) -> Tensor:
        z = hidden.float()
        b, n, _ = z.shape
        sq = z.square().sum(dim=-1)
        lse = _OnlineLogSumExp(b, z.device)
        for r0, r1 in _strips(n, b):
            lse.add(_mask_lower(_l2_logits(z, sq, r0, r1, tau), r1 - r0, -math.inf))
        m, log_s = lse.finish()
        ctx.save_for_backward(hidden, m, log_s)
        ctx.tau, ctx.lambda_norm = tau, lambda_norm
        per_seq = m + log_s - math.log(n * (n - 1)) + lambda_norm * z.square().mean(dim=(1, 2))
        return per_seq.mean()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, m, log_s = ctx.saved_tensors
        tau, lambda_norm = ctx.tau, ctx.lambda_norm
        z = hidden.float()
        b, n, d = z.shape
        sq = z.square().sum(dim=-1)
        weight_sum = torch.zeros(b, n, device=z.device)
        weighted_z = torch.zeros_like(z)
        for r0, r1 in _strips(n, b):
            # w = dL/dD of the unordered pair = 2 p_ij * (-1 / tau)
            weight = _softmax_(_l2_logits(z, sq, r0, r1, tau), m, log_s).mul_(-2.0 / tau)
            _mask_lower(weight, r1 - r0, 0.0)
            weight_sum[:, r0:r1] += weight.sum(dim=2)
            weight_sum[:, r0:] += weight.sum(dim=1)
            weighted_z[:, r0:r1].baddbmm_(weight, z[:, r0:])
            weighted_z[:, r0:].baddbmm_(weight.transpose(1, 2), z[:, r0:r1])
            del weight
        # dD_ij/dz_i = 2 (z_i - z_j)  ->  dz_i = 2 (z_i sum_j w_ij - sum_j w_ij z_j)
        dz = weight_sum[:, :, None] * z
        dz.sub_(weighted_z).mul_(2.0).add_(z, alpha=2.0 * lambda_norm / (n * d))
        dz.mul_(grad_out / b)
        return dz.to(hidden.dtype), None, None


def dispersion_loss(
    hidden: Tensor,
    variant: str,
    *,
    tau: float = 1.0,
    clamp: float = 0.1,
    lambda_norm: float = 0.1,
    max_tokens: int = 0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Dispersion loss of hidden states [B, N, d]: mean over sequences of a per-sequence loss.

    Pairs are token positions of the same sequence. Computed in fp32 whatever the
    input dtype; returns a 0-dim fp32 tensor, the gradient reaches ``hidden`` in its
    dtype. Memory-lean: nothing of size [B, N, N] is kept for backward.

    Variants (D_ij = arccos(clamp(c_ij, -1 + clamp, 1 - clamp)) / pi unless stated,
    with a straight-through gradient through the clamp):
      - ``angular_spread``: log sum_{i!=j} exp(-D_ij / tau) - log(N(N-1)).
      - ``orthogonalization``: mean_{i!=j} max(0, 1/2 - D_ij)^2.
      - ``l2_repel``: D_ij = |z_i - z_j|^2, log sum_{i!=j} exp(-D_ij / tau) - log(N(N-1))
        + lambda_norm * mean(z^2).
      - ``decorrelation``: mean_{i!=j} C_ij^2 with C the token-token correlation of the
        rows standardised over features (unbiased std).

    ``max_tokens`` > 0 restricts the loss to a random subset of that many positions
    (``torch.randperm(N, generator=generator)``, shared by the batch); 0 or >= N uses
    all. With N < 2 there are no pairs: the loss is 0 (only the lambda_norm term for
    l2_repel), still connected to ``hidden`` so backward gives zero/finite gradients.
    """
    _validate(hidden, variant, tau, clamp, max_tokens)
    hidden = _select_tokens(hidden, max_tokens, generator)
    if hidden.shape[1] < 2:
        return _no_pair_loss(hidden.float(), variant, lambda_norm)
    if variant == "l2_repel":
        return _L2RepelLoss.apply(hidden, float(tau), float(lambda_norm))
    return _CosinePairLoss.apply(hidden, variant, float(tau), float(clamp))


@torch.no_grad()
def mean_offdiag_cosine(hidden: Tensor) -> Tensor:
    """Batch mean of mean_{i!=j} cos(z_i, z_j), as a 0-dim fp32 tensor; O(B N d), no graph.

    Uses sum_{i!=j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 (the last term is N unless
    some z_i is zero), cheap enough to log the condensation of every block each step.
    Sequences with N < 2 have no pairs and count as 0.
    """
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be [B, N, d], got shape {tuple(hidden.shape)}")
    u, _, _ = _unit_rows(hidden, center=False)
    n = u.shape[1]
    if n < 2:
        return torch.zeros((), device=u.device)
    total = u.sum(dim=1).square().sum(dim=-1) - u.square().sum(dim=(1, 2))
    return (total / (n * (n - 1))).mean()
