"""Dispersion losses on per-block hidden states, plus a cheap condensation probe.

A dispersion loss pushes the token representations of one sequence apart so the
residual stream does not condense into a narrow cone. Every variant is a function
of the pairwise geometry of the N tokens of a sequence, i.e. of an N x N matrix.
Autograd on the obvious implementation (``dispersion_loss_reference``) keeps
several [B, N, N] fp32 matrices alive per hooked block until backward, which at
GPT-2 sizes (B=8, N=1024, 12 blocks) is gigabytes.

``dispersion_loss`` computes the same values without keeping anything of size
[B, N, N] for backward. Each implementation is a ``PairKernel``: here ``TorchStrips``,
which walks the upper triangle of the pair matrix once forward in row strips (a
temporary is [B, rows, N]) and recomputes it backward with analytic gradients, each
variant being a pair of elementwise functions on the Gram matrix (its term and dL/dg);
and the fused Triton kernels of ``dispersion_triton.py`` at the FLOP floor. What both
share (variants, ranges, precisions, the online log-sum-exp, the autograd Function
that saves only the input plus two scalars per sequence) is in ``variants.py``.

Notation: u_i = z_i / max(|z_i|, eps), c_ij = u_i . u_j, D_ij = arccos(c_ij) / pi
for the angular variants; "i != j" runs over the N(N-1) ordered pairs of one
sequence; the returned value is the mean over the B sequences.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Protocol

import torch
from torch import Tensor

from ..utils.errors import cause
from .variants import (
    FORMS,
    KERNELS,
    NORM_EPS,
    RANGES,
    SPECS,
    VARIANTS,
    OnlineLogSumExp,
    PairHyper,
    PairLoss,
    VariantSpec,
    precision_error,
    row_entropy_terms,
    row_norm,
)

# Default budget for the strip temporaries of TorchStrips: the rows per strip are
# chosen so that one [B, rows, N] fp32 buffer stays within it.
MAX_BLOCK_BYTES = 32 * 2**20


def _check_hidden(hidden: Tensor) -> None:
    """Refuse what is not hidden states [B, N, d] with a sequence and a feature: the mean over no
    sequence is NaN, and tokens without features have no geometry (N < 2 is fine: no pairs)."""
    if not isinstance(hidden, Tensor):
        raise ValueError(f"hidden must be a torch.Tensor [B, N, d], got {type(hidden).__name__}")
    if hidden.dim() != 3 or hidden.shape[0] == 0 or hidden.shape[2] == 0:
        raise ValueError(f"hidden must be [B, N, d] with B >= 1 and d >= 1, got shape {tuple(hidden.shape)}")


def _validate(
    hidden: Tensor, variant: str, tau: float, clamp: float, lambda_norm: float, max_tokens: int, form: str
) -> None:
    """Reject arguments that would silently give a meaningless loss."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    for name, value in (("tau", tau), ("clamp", clamp), ("lambda_norm", lambda_norm), ("max_tokens", max_tokens)):
        valid, text = RANGES[name]
        if not isinstance(value, numbers.Real | Tensor):
            raise ValueError(f"{name} must be a number {text}, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number {text}, got {value}")
        if not valid(value):
            raise ValueError(f"{name} must be {text}, got {value}")
    _check_hidden(hidden)
    if not hidden.is_floating_point():
        raise ValueError(f"hidden must be a floating-point tensor, got {hidden.dtype}")
    if variant == "decorrelation" and hidden.shape[-1] < 2:
        raise ValueError("hidden needs d >= 2 for decorrelation (the std divides by d - 1)")


def select_tokens(layers: list[Tensor], max_tokens: int, generator: torch.Generator | None) -> list[Tensor]:
    """Subsample positions uniformly, the same subset for every sequence of every layer.

    The cost is quadratic in N, so long sequences are subsampled; sharing the subset
    keeps the draw a single ``randperm`` the caller can make reproducible.
    """
    n = layers[0].shape[1]
    if max_tokens == 0 or max_tokens >= n:
        return layers
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    device = generator.device if generator is not None else layers[0].device
    idx = torch.randperm(n, generator=generator, device=device)[:max_tokens]
    return [h.index_select(1, idx.to(h.device)) for h in layers]  # .to: a no-op unless the generator is elsewhere


def _no_pair_loss(z: Tensor, variant: str, lambda_norm: float) -> Tensor:
    """Loss for N < 2: no pairs, so 0 (plus the norm penalty of l2_repel), still on the graph."""
    loss = z.sum() * 0.0
    if SPECS[variant].norm_penalty and z.shape[1] > 0:
        loss = loss + lambda_norm * z.square().mean(dim=(1, 2)).mean()
    return loss


@torch.autocast("cuda", enabled=False)  # the contract's fp32 whatever the caller's autocast, on either device
@torch.autocast("cpu", enabled=False)
def dispersion_loss_reference(
    hidden: Tensor,
    variant: str,
    *,
    tau: float = 1.0,
    clamp: float = 0.1,
    lambda_norm: float = 0.1,
    max_tokens: int = 0,
    generator: torch.Generator | None = None,
    form: str = "released",
) -> Tensor:
    """Naive dispersion loss: materialises the [B, N, N] matrices and lets autograd differentiate.

    Same contract as ``dispersion_loss``; kept as the readable definition that tests
    and ``bench/dispersion_loss.py`` compare the memory-lean version against. Its gradient is
    autograd's: a backward run inside autocast computes it under autocast.
    """
    _validate(hidden, variant, tau, clamp, lambda_norm, max_tokens, form)
    z = select_tokens([hidden], max_tokens, generator)[0].float()
    _, n, d = z.shape
    if n < 2:
        return _no_pair_loss(z, variant, lambda_norm)
    eps = PairHyper(tau, clamp, n * (n - 1), form).eps
    diag = torch.eye(n, dtype=torch.bool, device=z.device)
    offdiag_mean = lambda t: t.masked_fill(diag, 0.0).sum(dim=(1, 2)) / (n * (n - 1))  # noqa: E731

    if variant == "decorrelation":
        zc = z - z.mean(dim=-1, keepdim=True)
        zc = zc / zc.std(dim=-1, keepdim=True).clamp_min(NORM_EPS)
        per_seq = offdiag_mean((zc @ zc.transpose(1, 2) / (d - 1)).square())
    elif SPECS[variant].rows == "raw":
        sq = z.square().sum(dim=-1)
        logits = -(sq[:, :, None] + sq[:, None, :] - 2 * (z @ z.transpose(1, 2))) / tau
        if SPECS[variant].row_entropy:
            p = torch.softmax(logits.masked_fill(diag, -math.inf), dim=2)
            log = torch.log2(p + eps if eps else p.clamp_min(torch.finfo(p.dtype).tiny))  # 0 log 0 = 0
            per_seq = (p * log).sum(dim=2).mean(dim=1)
        else:
            if form == "released":  # all N^2 pairs: D_ii = 0 exactly
                logits, pairs = logits.masked_fill(diag, 0.0), n * n
            else:
                logits, pairs = logits.masked_fill(diag, -math.inf), n * (n - 1)
            per_seq = torch.logsumexp(logits + eps, dim=(1, 2)) - math.log(pairs)
            per_seq = per_seq + lambda_norm * z.square().mean(dim=(1, 2))
    else:
        u = z / (row_norm(z).clamp_min(NORM_EPS) + eps)
        cos = u @ u.transpose(1, 2)
        # Straight-through clamp: arccos sees the clamped value (finite slope), and
        # its gradient reaches cos unchanged even where cos was outside the range.
        cos_st = cos + (cos.clamp(-1 + clamp, 1 - clamp) - cos).detach()
        ang = torch.arccos(cos_st) / math.pi
        if variant == "angular_spread":
            logits = (-ang / tau).masked_fill(diag, -math.inf)
            per_seq = torch.logsumexp(logits + eps, dim=(1, 2)) - math.log(n * (n - 1))
        else:
            per_seq = offdiag_mean(torch.relu(0.5 - ang).square())
    return per_seq.mean()


# ----------------------------------------------------------------------------------
# Memory-lean implementation
# ----------------------------------------------------------------------------------


def _mask_lower(buf: Tensor, rows: int, fill: float) -> Tensor:
    """Blank the diagonal and below in a strip's leading [rows, rows] block (in place)."""
    lower = torch.ones(rows, rows, dtype=torch.bool, device=buf.device).tril_()
    buf[:, :, :rows].masked_fill_(lower, fill)
    return buf


def _softmax_(logits: Tensor, m: Tensor, log_s: Tensor) -> Tensor:
    """p_ij = exp(x_ij - lse) of one strip, in place, in the precise form (x - m) - log_s: m and log_s
    per sequence [B] (the log-sum-exp over all pairs) or per row [B, rows] (whole-row softmaxes)."""
    m, log_s = (t.reshape(t.shape[0], -1, 1) for t in (m, log_s))
    return logits.sub_(m).sub_(log_s).exp_()


def _hinge_(angle: Tensor) -> Tensor:
    """relu(1/2 - D) from pi * D, in place."""
    return angle.mul_(-1.0 / math.pi).add_(0.5).clamp_min_(0.0)


def _gram(x: Tensor, sq: Tensor | None, r0: int, r1: int, c0: int) -> tuple[Tensor, Tensor | None]:
    """Rows [r0, r1) x columns [c0, N) of the Gram matrix g_ij = x_i . x_j, and there |x_i|^2 + |x_j|^2 (or None
    without squared norms)."""
    sq_sum = None if sq is None else sq[:, r0:r1, None] + sq[:, None, c0:]
    return torch.bmm(x[:, r0:r1], x[:, c0:].transpose(1, 2)), sq_sum


def _pair_term_(gram: Tensor, sq_sum: Tensor | None, spec: VariantSpec, hp: PairHyper) -> Tensor:
    """The pair's term t_ij (the logit for log-sum-exp variants) on a strip of the Gram matrix g_ij = x_i . x_j,
    in place on ``gram``; sq_sum = |x_i|^2 + |x_j|^2 for raw rows, else None. dispersion_triton.py's
    ``_pair_term`` in torch."""
    if spec.name == "decorrelation":
        return gram.square_()
    if spec.rows == "raw":  # -D / tau, D = (s_i + s_j) - 2 g: the reference's operation order, so both round alike
        return sq_sum.sub_(gram, alpha=2.0).div_(-hp.tau)
    angle = gram.clamp_(-1 + hp.clamp, 1 - hp.clamp).arccos_()  # the clamp: a finite slope everywhere
    if spec.name == "angular_spread":
        return angle.mul_(-1.0 / (math.pi * hp.tau))  # -D / tau
    return _hinge_(angle).square_()


def _pair_grad_(
    gram: Tensor, sq_sum: Tensor | None, spec: VariantSpec, hp: PairHyper, lse: tuple[Tensor, ...]
) -> Tensor:
    """dL/dg_ij of the unordered pair {i, j}, in place on ``gram``; lse = (m, log_s) for the log-sum-exp
    variants, else unread. dispersion_triton.py's ``_pair_weight`` in torch."""
    if spec.name == "decorrelation":
        return gram.mul_(4.0 / hp.pairs)  # L = (2 / pairs) sum_{i<j} c^2
    if spec.rows == "raw":  # dL/dD of the unordered pair is 2 p_ij * (-1 / tau), and dD/dg = -2
        return _softmax_(_pair_term_(gram, sq_sum, spec, hp), *lse).mul_(4.0 / hp.tau)
    cos = gram.clamp_(-1 + hp.clamp, 1 - hp.clamp)
    angle = torch.arccos(cos)
    slope = cos.square_().neg_().add_(1.0).rsqrt_().mul_(1.0 / math.pi)  # -dD/dc at the clamped c: straight-through
    if spec.name == "angular_spread":  # L = log sum_{i!=j} exp(-D / tau) - const  ->  dL/dc = 2 p_ij / tau * (-dD/dc)
        return _softmax_(angle.mul_(-1.0 / (math.pi * hp.tau)), *lse).mul_(slope).mul_(2.0 / hp.tau)
    # L = (2 / pairs) sum_{i<j} relu(1/2 - D)^2  ->  dL/dc = (4 / pairs) relu(1/2 - D) (-dD/dc)
    return _hinge_(angle).mul_(slope).mul_(4.0 / hp.pairs)


def _rows(hidden: Tensor, spec: VariantSpec, hp: PairHyper) -> tuple[Tensor, Tensor | None, Tensor | None, float]:
    """The fp32 rows x whose Gram matrix the variant needs; for raw rows also their squared norms, for unit and
    centred rows the denominator and guard of u = x / (max(|x|, guard) + eps), x = z or z minus its feature mean
    (eps > 0 is the released code's z / (|z| + 1e-2)).

    For decorrelation (centred) the guard (VariantSpec.guard) makes u_i . u_j exactly the reference's
    C_ij = z_c,i . z_c,j / (d-1) with the std clamped at NORM_EPS. Raw rows are centred
    on the sequence's mean token, as in the Triton kernel: distances are unchanged, and
    |x_i|^2 + |x_j|^2 - 2 g_ij cancels less when the tokens share a large offset."""
    x = hidden.float()
    if spec.rows == "raw":
        x = x - x.mean(dim=1, keepdim=True)
        return x, x.square().sum(dim=-1), None, 0.0
    if spec.rows == "centred":
        x = x - x.mean(dim=-1, keepdim=True)
    guard = spec.guard(x.shape[-1])
    norm = row_norm(x).clamp_min(guard) + hp.unit_eps(spec)
    return x / norm, None, norm, guard


@dataclass(frozen=True)
class TorchStrips:
    """The pair pass in plain PyTorch: the upper triangle in row strips of batched matmuls.

    A strip's temporaries are [B, rows, N - r0] fp32; ``rows`` is the largest count
    within ``max_block_bytes`` per buffer and at most ``max_block_rows``. Strips over
    the upper triangle skip the lower triangle only between strips, so a few strips
    are needed to roughly halve the elementwise work; more mean smaller, slower matmuls.
    """

    max_block_bytes: int = MAX_BLOCK_BYTES
    max_block_rows: int = 128

    def loss(self, layers: list[Tensor], spec: VariantSpec, hp: PairHyper, lambda_norm: float) -> Tensor:
        return PairLoss.apply(spec, hp, lambda_norm, self, torch.cat(layers) if len(layers) > 1 else layers[0])

    def strips(self, n: int, batch: int, whole_rows: bool = False) -> Iterator[tuple[int, int]]:
        """Row ranges [r0, r1): by default covering rows 0..n-2 (row n-1 has no pair above the
        diagonal), strip [r0, r1) paired with columns [r0, n), so every strip holds at least one
        strict-upper-triangle pair and its temporaries are [batch, r1 - r0, n - r0]; with
        ``whole_rows`` all n rows, each paired with all n columns (perplexity_entropy's softmax is
        per row), temporaries [batch, r1 - r0, n]."""
        rows = max(1, min(self.max_block_rows, self.max_block_bytes // (4 * batch * n)))
        end = n if whole_rows else n - 1
        for r0 in range(0, end, rows):
            yield r0, min(r0 + rows, end)

    def forward(
        self, layers: tuple[Tensor], spec: VariantSpec, hp: PairHyper, lambda_norm: float
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """The per-sequence loss of ``layers``' one tensor and what backward needs: (m, log_s) of the log-sum-exp
        over i < j (log-sum-exp variants); perplexity_entropy's per-token results from each whole-row strip's
        softmax, each [B, N]: its row's log-sum-exp (m, log_s), sum_j f(p_ij) and a_i = sum_j p_ij f'(p_ij) (see
        ``variants.row_entropy_terms``); else nothing."""
        (hidden,) = layers
        x, sq, _, _ = _rows(hidden, spec, hp)
        b, n, _ = x.shape
        if spec.row_entropy:
            out = tuple(torch.empty(b, n, device=x.device) for _ in range(4))
            for r0, r1 in self.strips(n, b, whole_rows=True):
                logits = self._row_logits(x, sq, spec, hp, r0, r1)
                m = logits.amax(dim=2)
                log_s = (logits - m[:, :, None]).exp_().sum(dim=2).log_()
                f, pf = row_entropy_terms(_softmax_(logits, m, log_s), hp.eps)
                for target, value in zip(out, (m, log_s, f.sum(dim=2), pf.sum(dim=2)), strict=True):
                    target[:, r0:r1] = value
            per_seq, saved = out[2].mean(dim=1), out
        else:
            lse = OnlineLogSumExp(b, x.device)
            total = torch.zeros(b, device=x.device)
            for r0, r1 in self.strips(n, b):
                term = _pair_term_(*_gram(x, sq, r0, r1, r0), spec, hp)
                if spec.logsumexp:
                    lse.add(_mask_lower(term, r1 - r0, -math.inf))
                else:
                    total += _mask_lower(term, r1 - r0, 0.0).sum(dim=(1, 2))
            per_seq, *saved = lse.finish(spec, hp, n) if spec.logsumexp else (2.0 * total / hp.pairs,)
        if spec.norm_penalty:
            per_seq = per_seq + lambda_norm * hidden.float().square().mean(dim=(1, 2))
        return per_seq, tuple(saved)

    def backward(
        self, layers: tuple[Tensor], saved: tuple[Tensor, ...], grad_out: Tensor, spec: VariantSpec, hp: PairHyper,
        lambda_norm: float,
    ) -> tuple[Tensor]:  # fmt: skip
        """dL/dhidden from du_i = sum_{j!=i} W_ij x_j with W = dL/dg, and for raw rows also sum_{j!=i} W_ij.

        Each unordered pair is visited once: du_rows += W x_cols, du_cols += W^T x_rows. For
        perplexity_entropy, dL/dt_ij = p_ij (f'(p_ij) - a_i) / N of each ordered pair, so W = -2 dL/dD =
        (2 / (tau N)) (p f' - p a_i); both orientations of every pair reach du and the row sums.
        """
        (hidden,) = layers
        x, sq, norm, guard = _rows(hidden, spec, hp)
        b, n, d = x.shape
        du = torch.zeros_like(x)
        row_sums = torch.zeros(b, n, device=x.device) if sq is not None else None
        for r0, r1 in self.strips(n, b, whole_rows=spec.row_entropy):
            c0 = 0 if spec.row_entropy else r0  # the strip's columns: all, or the upper triangle's
            x_rows, x_cols = x[:, r0:r1], x[:, c0:]
            if spec.row_entropy:
                m, log_s, _, a = (t[:, r0:r1] for t in saved)  # the rows' (m, log_s, entropy, a) from forward
                p = _softmax_(self._row_logits(x, sq, spec, hp, r0, r1), m, log_s)
                _, pf = row_entropy_terms(p, hp.eps)
                weight = pf.sub_(p.mul_(a[:, :, None])).mul_(2.0 / (hp.tau * n))
                del p, pf
            else:
                weight = _mask_lower(_pair_grad_(*_gram(x, sq, r0, r1, c0), spec, hp, saved), r1 - r0, 0.0)
            if row_sums is not None:
                row_sums[:, r0:r1] += weight.sum(dim=2)
                row_sums[:, c0:] += weight.sum(dim=1)
            du[:, r0:r1].baddbmm_(weight, x_cols)
            du[:, c0:].baddbmm_(weight.transpose(1, 2), x_rows)
            del weight
        scale = grad_out / b
        if spec.rows == "raw":
            # D_ij = |x_i|^2 + |x_j|^2 - 2 g_ij  ->  dx_i = sum_j W_ij x_j - x_i sum_j W_ij, whose sum over
            # i is 0 (W symmetric): the centring's backward is a no-op. The norm penalty sees z itself.
            penalty = 2.0 * lambda_norm / (n * d) if spec.norm_penalty else 0.0
            dx = du.sub_(row_sums[:, :, None] * x).add_(hidden.float(), alpha=penalty).mul_(scale)
        else:
            # Through u = x / (max(|x|, guard) + eps): dx = (du - u (u . du) (|x| + eps) / |x|) / (|x| + eps),
            # the radial part dropped where |x| was clamped. For decorrelation x = z - mean(z), whose
            # backward would subtract the feature mean of dx; that mean is already 0, as du and u are
            # combinations of centred rows. x holds u.
            du.mul_(scale)
            eps = hp.unit_eps(spec)
            radial = (x * du).sum(dim=-1, keepdim=True).masked_fill_(norm - eps <= guard, 0.0)
            if eps:
                radial.mul_(norm / (norm - eps))
            dx = du.sub_(x.mul_(radial)).div_(norm)
        return (dx.to(hidden.dtype),)

    @staticmethod
    def _row_logits(x: Tensor, sq: Tensor, spec: VariantSpec, hp: PairHyper, r0: int, r1: int) -> Tensor:
        """-D / tau for whole rows [r0, r1) against all columns, the diagonal i = j at -inf."""
        logits = _pair_term_(*_gram(x, sq, r0, r1, 0), spec, hp)
        logits[:, :, r0:r1].diagonal(dim1=1, dim2=2).fill_(-math.inf)
        return logits


class PairKernel(Protocol):
    """One implementation of the exact loss: TorchStrips here, TritonTiles in dispersion_triton.py. ``layers``:
    hidden states [B, N, d] of the same shape and dtype, whose loss is that of their concatenation."""

    def loss(self, layers: list[Tensor], spec: VariantSpec, hp: PairHyper, lambda_norm: float) -> Tensor: ...


class KernelUnavailable(RuntimeError):
    """The Triton kernel cannot be used here: it does not build, or it disagrees with the torch path."""


@functools.cache
def _triton_module() -> ModuleType | str:
    """The Triton kernels' module, or why it does not import (triton is optional on CPU-only
    installs, and importing it costs seconds where the torch path is used)."""
    try:
        from dispersion_titan.losses import dispersion_triton  # optional: see above
    except ImportError as err:
        return str(err)
    return dispersion_triton


# The probe's (value, gradient) tolerances: above each precision's error on random inputs as
# measured on an H100 (docs/benchmarks.md), far below what a broken kernel gives.
_PROBE_TOLERANCE = {"exact": (1e-4, 2e-3), "tf32": (5e-3, 2e-2), "bf16": (2e-3, 3e-2), "auto": (2e-3, 3e-2)}


@functools.cache
def check_triton_kernel(device: torch.device, variant: str, precision: str) -> None:
    """Run the Triton kernel once on a small probe against TorchStrips (value and gradient).

    Raises KernelUnavailable in one line naming the cause and the setting that avoids
    it; never falls back in silence. Cached: once per process, device, variant and precision.
    """
    avoid = "set dispersion.kernel = 'torch' (kernel='torch') to use the PyTorch path"
    if isinstance(problem := _triton_module(), str):
        raise KernelUnavailable(f"the Triton dispersion kernel does not import ({problem}); {avoid}")
    probe = torch.randn(2, 130, 96, generator=torch.Generator().manual_seed(0)).to(device)

    def value_and_grad(kernel: PairKernel) -> tuple[Tensor, Tensor]:
        x = probe.clone().requires_grad_()
        loss = dispersion_loss(x, variant, kernel=kernel)
        return loss.detach().double(), torch.autograd.grad(loss, x)[0].double()

    try:
        value, grad = value_and_grad(_triton_module().TritonTiles(precision))
    except Exception as err:  # a missing C compiler or Python.h surfaces here, at the first build
        raise KernelUnavailable(f"the Triton dispersion kernel does not build or run on {device}: {cause(err)}; "
                                f"{avoid}") from err  # fmt: skip
    ref_value, ref_grad = value_and_grad(TorchStrips())
    value_gap = ((value - ref_value).abs() / ref_value.abs().clamp_min(1e-12)).item()
    grad_gap = ((grad - ref_grad).abs().max() / ref_grad.abs().max().clamp_min(1e-12)).item()
    value_tol, grad_tol = _PROBE_TOLERANCE[precision]
    if not (value_gap <= value_tol and grad_gap <= grad_tol):
        raise KernelUnavailable(
            f"the Triton dispersion kernel ({variant}, precision {precision}) disagrees with the torch path on "
            f"{device}: relative gap {value_gap:.1e} in value, {grad_gap:.1e} in gradient; {avoid}"
        )


def _pair_kernel(kernel: str | PairKernel, device: torch.device, variant: str, precision: str) -> PairKernel:
    """The implementation for ``kernel`` (a name from KERNELS, or a configured kernel object)."""
    if not isinstance(kernel, str) and hasattr(kernel, "loss"):
        return kernel
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS} or a kernel object, got {kernel!r}")
    if kernel == "torch" or (kernel == "auto" and device.type != "cuda"):
        return TorchStrips()
    if kernel == "auto":
        check_triton_kernel(device, variant, precision)
    elif isinstance(problem := _triton_module(), str):
        raise ValueError(f"kernel='triton' needs the triton package, which does not import here ({problem})")
    return _triton_module().TritonTiles(precision)


def dispersion_loss(
    hidden: Tensor | Sequence[Tensor],
    variant: str,
    *,
    tau: float = 1.0,
    clamp: float = 0.1,
    lambda_norm: float = 0.1,
    max_tokens: int = 0,
    generator: torch.Generator | None = None,
    kernel: str | PairKernel = "auto",
    precision: str = "auto",
    form: str = "released",
) -> Tensor:
    """Dispersion loss of hidden states [B, N, d]: mean over sequences of a per-sequence loss.

    Pairs are token positions of the same sequence. Accumulated in fp32 whatever the
    input dtype and autocast; returns a 0-dim fp32 tensor, the gradient reaches
    ``hidden`` in its dtype. Memory-lean: nothing of size [B, N, N] is kept for backward.

    Variants (D_ij = arccos(clamp(c_ij, -1 + clamp, 1 - clamp)) / pi unless stated,
    with a straight-through gradient through the clamp; eps = 1e-2 in the default
    ``form="released"``, the authors' lm_dispersion/dispersion.py, and 0 in ``form="paper"``):
      - ``angular_spread``: log sum_{i!=j} exp(-D_ij / tau + eps) - log(N(N-1)),
        c_ij = z_i . z_j / ((|z_i| + eps)(|z_j| + eps)).
      - ``orthogonalization``: mean_{i!=j} max(0, 1/2 - D_ij)^2, c as above.
      - ``l2_repel``: D_ij = |z_i - z_j|^2, + lambda_norm * mean(z^2) and
        released: log mean_{i,j} exp(-D_ij / tau + eps), the N pairs i = j (D = 0) included;
        paper: log sum_{i!=j} exp(-D_ij / tau) - log(N(N-1)).
      - ``decorrelation``: mean_{i!=j} C_ij^2 with C the token-token correlation of the
        rows standardised over features (unbiased std).
      - ``perplexity_entropy``: mean_i sum_{j!=i} p_j|i log2(p_j|i + eps), p_j|i the softmax
        over j != i of -D_ij / tau (tau = sigma^2): the negative mean entropy.

    ``hidden`` may also be a sequence of such tensors of one shape and dtype (say, several blocks'
    outputs): the loss of their concatenation along the batch, which the Triton kernel computes
    from the tensors as they are, without a concatenated copy.

    ``max_tokens`` > 0 restricts the loss to a random subset of that many positions
    (``torch.randperm(N, generator=generator)``, shared by the batch); 0 or >= N uses
    all. With N < 2 there are no pairs: the loss is 0 (only the lambda_norm term for
    l2_repel), still connected to ``hidden`` so backward gives zero/finite gradients.

    ``kernel``: a name from KERNELS ("auto" raises KernelUnavailable where its probe of the Triton
    kernel fails) or a configured kernel object; ``precision``: the Triton kernel's products, one of
    PRECISIONS.
    """
    layers = [hidden] if isinstance(hidden, Tensor) or not isinstance(hidden, Iterable) else list(hidden)
    if not layers:
        raise ValueError("hidden must be a tensor or a non-empty sequence of tensors, got an empty sequence")
    for layer in layers:
        _validate(layer, variant, tau, clamp, lambda_norm, max_tokens, form)
        if (layer.shape, layer.dtype, layer.device) != (layers[0].shape, layers[0].dtype, layers[0].device):
            raise ValueError(
                f"hidden's tensors must share shape, dtype and device, got {tuple(layers[0].shape)} "
                f"{layers[0].dtype} {layers[0].device} and {tuple(layer.shape)} {layer.dtype} {layer.device}"
            )
    problem = precision_error(variant, getattr(kernel, "precision", precision))  # a kernel object's own, if any
    if problem:
        raise ValueError(f"precision {problem}")
    pair_kernel = _pair_kernel(kernel, layers[0].device, variant, precision)
    layers = select_tokens(layers, max_tokens, generator)
    n = layers[0].shape[1]
    if n < 2:
        return _no_pair_loss(torch.cat(layers).float(), variant, lambda_norm)
    hp = PairHyper(float(tau), float(clamp), n * (n - 1), form)
    return pair_kernel.loss(layers, SPECS[variant], hp, float(lambda_norm))


@torch.no_grad()
def mean_offdiag_cosine(hidden: Tensor) -> Tensor:
    """Batch mean of mean_{i!=j} cos(z_i, z_j), as a 0-dim fp32 tensor; O(B N d), no graph.

    Uses sum_{i!=j} u_i . u_j = |sum_i u_i|^2 - sum_i |u_i|^2 (the last term is N unless
    some z_i is zero), cheap enough to log the condensation of every block each step.
    Sequences with N < 2 have no pairs and count as 0.
    """
    _check_hidden(hidden)
    u = torch.nn.functional.normalize(hidden.float(), dim=-1, eps=NORM_EPS)  # u = z / max(|z|, NORM_EPS)
    n = u.shape[1]
    if n < 2:
        return torch.zeros((), device=u.device)
    total = u.sum(dim=1).square().sum(dim=-1) - u.square().sum(dim=(1, 2))
    return (total / (n * (n - 1))).mean()
