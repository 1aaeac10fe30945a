"""The exact dispersion loss in fused Triton kernels, at its FLOP floor of about 4·B·N²·d.

The loss is a function of each sequence's Gram matrix g = U U^T; its gradient is
dU = W U with W = dL/dg symmetric. The floor is the Gram triangle forward (N²d), its
recompute backward (N²d) and W U (2N²d). Four kernels, in the style of flash attention:

- ``_rows_kernel`` (forward, and again backward: recomputed, not saved): one program per
  token: u = z / |z| (centred over features for decorrelation; for l2_repel the sequence's
  mean token subtracted, which leaves distances unchanged and keeps low-precision
  products safe), cast to the product dtype, with the per-token scalars the epilogue needs;
- ``_pairs_forward_kernel``: one program per upper-triangle tile pair (ti <= tj) of a
  sequence: the Gram tile by ``tl.dot``, the variant's term in registers, one partial
  (max, sum exp) or sum per tile, combined by torch (online log-sum-exp, no atomics);
- ``_pairs_backward_kernel``: the same tiles recomputed once; W written once per tile pair
  into a [B, N, N] buffer (the tile and its transpose), plus per-token partials of the
  radial term r_i = sum_j W_ij g_ij (sum_j W_ij for l2_repel), one slot per tile: no atomics;
- ``_dz_kernel``: dU = W U in one pass, whose epilogue is the backward through the rows
  (the radial projection, 1/|z|, the loss's scale, the cast to the hidden states' dtype).

Under ``TRITON_INTERPRET=1`` (CPU) the same kernels run in Triton's interpreter, with bf16
products emulated exactly in fp32 (its own bf16 casts and dots are not IEEE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton import knobs

from dispersion_titan.losses.variants import NORM_EPS, PRECISIONS, OnlineLogSumExp, PairHyper, VariantSpec

# Whether the @triton.jit kernels below were built for the interpreter (TRITON_INTERPRET=1
# when this module was first imported): then they run on CPU tensors too.
INTERPRETED = bool(knobs.runtime.interpret)

# Budget for the backward's pair-weight buffer [sequences, N, N]: sequences go in
# groups that fit (32 MiB at B 16, N 1024 in bf16; 32 MiB at B 1, N 4096).
MAX_WEIGHT_BYTES = 512 * 2**20

_PI = tl.constexpr(math.pi)
_HALF_PI = tl.constexpr(math.pi / 2)
_INV_PI = tl.constexpr(1.0 / math.pi)
_LN2 = tl.constexpr(math.log(2.0))


class TileConfig(NamedTuple):
    """Fixed tiles for every kernel (the interpreter's, or a test's): no autotune."""

    block: int  # pair tiles are block x block; rows of dU per program of the W U pass
    block_k: int  # features per Gram step; tokens per step of W U
    block_d: int  # features of dU per program of the W U pass
    num_warps: int


def pair_block(n: int) -> int:
    """The GPU's square pair tile: 64. Compiled for sm_90 as a launch specialises it (pointers and
    sizes divisible by 16), the 128 x 128 backward spills registers in its elementwise math at 8 warps
    (angular_spread, orthogonalization: 0.4-0.5 KB; perplexity_entropy: 5 KB), while every 64 x 64
    build stays within 45-180 registers, spill-free (tests/test_dispersion_kernel.py, docs/benchmarks.md).

    One size for the forward and backward pair kernels, chosen here rather than by
    autotune: the triangle's indexing and the radial slots depend on it.
    """
    return 64


# What autotune tries on a GPU, per (N, d): K steps, warps and stages of the pair kernels, and the
# W U pass's tiles. Every configuration is compiled for sm_90 as a launch builds it in
# tests/test_dispersion_kernel.py, which asserts no register spills, wgmma fed by async copies
# (cp.async) and shared memory within the limit (32-96 KiB here).
PAIR_CONFIGS = (  # (BLOCK_K, num_warps, num_stages); at 4 warps perplexity_entropy's backward spills
    (64, 8, 3),
    (32, 8, 4),
    (64, 8, 2),
)
DZ_CONFIGS = (  # (BLOCK, BLOCK_K, BLOCK_D, num_warps, num_stages); 128 x 128 outputs spill at 4 warps
    (128, 64, 64, 8, 3),
    (64, 64, 64, 4, 3),
    (64, 64, 128, 8, 3),
)
# Under the interpreter each tl op costs about the same whatever its size: small tiles
# exercise the masking of partial tiles at test sizes.
INTERPRETER_TILES = TileConfig(16, 32, 32, 1)


class _Products(NamedTuple):
    """How one precision setting computes: storage of U and W, and the tl.dot input precisions."""

    store_bf16: bool
    dot: str  # "bf16" (bf16 operands), or tl.dot's input_precision for fp32 operands
    dz_dot: str = ""  # the W U pass's, when it differs from the pair passes'

    @property
    def wu_dot(self) -> str:
        return self.dz_dot or self.dot


def products(precision: str, spec: VariantSpec) -> _Products:
    """The storage and product precision of a PRECISIONS setting for a variant."""
    if precision == "auto" and spec.row_entropy:
        # Each row's softmax at sigma^2 = tau is sharp: bf16 rows put errors of ~0.5 into its
        # logits at d 64 (15% in the gradient, as tests/test_dispersion_kernel.py's cases showed),
        # so its logits are split-precision tf32 products on the tensor cores (tf32x3: about
        # fp32's accuracy, where ieee fp32 ran on CUDA cores); W U in tf32.
        return _Products(False, "tf32x3", "tf32")
    if precision in ("auto", "bf16"):
        return _Products(True, "bf16")
    if precision == "tf32":
        return _Products(False, "tf32")
    return _Products(False, "ieee" if spec.rows == "raw" else "bf16x3")


# ----------------------------------------------------------------------------- shared device code


@triton.jit
def _arccos(x):
    """arccos(x) for x in [-1, 1] (Abramowitz & Stegun 4.4.46, reflected for x < 0).

    arccos(|x|) = sqrt(1 - |x|) * P7(|x|), |error| <= 2e-8 in exact arithmetic; in
    fp32 the max abs error against float64 arccos is below 5e-7 on [-1, 1]
    (tests/test_dispersion_kernel.py measures it on a dense grid). P7(0) is pi/2
    rounded like torch's arccos(0), so a zero vector's pairs get D = 1/2 exactly, as in
    the torch paths: orthogonalization's hinge relu(1/2 - D) has its kink there, and
    the normalisation guard scales that row's gradient by 1e6.
    """
    a = tl.abs(x)
    p = -0.0012624911
    p = p * a + 0.0066700901
    p = p * a - 0.0170881256
    p = p * a + 0.0308918810
    p = p * a - 0.0501743046
    p = p * a + 0.0889789874
    p = p * a - 0.2145988016
    p = p * a + _HALF_PI
    r = tl.sqrt_rn(1.0 - a) * p
    return tl.where(x < 0, _PI - r, r)


@triton.jit
def _bf16_in_fp32(x):
    """x rounded to bf16 (to nearest even), kept as fp32: the interpreter's own bf16 casts
    round half up and drop the carry, and its dot multiplies bf16 tiles as their uint16 storage."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tf32_in_fp32(x):
    """x rounded to tf32 (10 mantissa bits, to nearest, ties away from zero), kept as fp32:
    the operand split of tl.dot's "tf32x3" on NVIDIA GPUs (cvt.rna.tf32.f32)."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x1000) & 0xFFFFE000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tf32_truncated(x):
    """x as the tensor cores read an fp32 operand of a plain "tf32" product: its 13 low mantissa bits
    dropped (truncated toward zero, not rounded: tl.dot's documentation warns of the bias), kept as fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    return (bits & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _stored(x, STORE_BF16: tl.constexpr, INTERPRET: tl.constexpr):
    """fp32 x as it is stored: rounded to bf16 (to nearest even) or unchanged."""
    y = x
    if STORE_BF16:
        if INTERPRET:
            y = _bf16_in_fp32(x).to(tl.bfloat16)
        else:
            y = x.to(tl.bfloat16)
    return y


@triton.jit
def _dot(a, b, acc, DOT: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation: bf16 operands for DOT "bf16", else fp32 operands
    multiplied in tl.dot's input precision DOT ("tf32", "tf32x3", "bf16x3", "ieee").

    The interpreter multiplies in fp32: exactly the bf16 products for stored bf16
    operands; bf16x3 and tf32x3 emulated as the GPU splits them (hi.hi + hi.lo + lo.hi);
    tf32 with its operands truncated to tf32, as the GPU's tensor cores read them.
    """
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        if DOT == "tf32x3":
            a_hi = _tf32_in_fp32(a)
            b_hi = _tf32_in_fp32(b)
            acc = tl.dot(_tf32_in_fp32(a - a_hi), b_hi, acc, input_precision="ieee")
            acc = tl.dot(a_hi, _tf32_in_fp32(b - b_hi), acc, input_precision="ieee")
            acc = tl.dot(a_hi, b_hi, acc, input_precision="ieee")
        elif DOT == "bf16x3":
            a_hi = _bf16_in_fp32(a)
            b_hi = _bf16_in_fp32(b)
            acc = tl.dot(a_hi, b_hi, acc, input_precision="ieee")
            acc = tl.dot(a_hi, _bf16_in_fp32(b - b_hi), acc, input_precision="ieee")
            acc = tl.dot(_bf16_in_fp32(a - a_hi), b_hi, acc, input_precision="ieee")
        elif DOT == "tf32":
            acc = tl.dot(_tf32_truncated(a), _tf32_truncated(b), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    elif DOT == "bf16":
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=DOT)
    return acc


@triton.jit
def _tile_pair(tiles):
    """The program's upper-triangle tile pair (ti, tj), ti <= tj, of ``tiles`` row tiles.

    Programs run row tile 0's pairs first (the longest row); q counts them in reverse.
    """
    total = tiles * (tiles + 1) // 2
    q = total - 1 - tl.program_id(0)
    k = ((tl.sqrt_rn((8 * q + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)
    k = tl.where((k + 1) * (k + 2) // 2 <= q, k + 1, k)  # the float root may be one off
    k = tl.where(k * (k + 1) // 2 > q, k - 1, k)
    ti = tiles - 1 - k
    tj = ti + (q - k * (k + 1) // 2)
    return ti, tj


@triton.jit
def _gram_tile(u_seq, rows, cols, n, d, DOT: tl.constexpr, INTERPRET: tl.constexpr,
               BLOCK: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """g = u_rows . u_cols^T [BLOCK, BLOCK] of one sequence (u_seq: its first row); rows >= n give 0."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = u_seq + rows[:, None] * d + ks[None, :]
    b_ptrs = u_seq + cols[None, :] * d + ks[:, None]  # u_cols^T, [BLOCK_K, BLOCK]
    g = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        a = tl.load(a_ptrs + k0, mask=(rows[:, None] < n) & (ks[None, :] < d - k0), other=0.0)
        b = tl.load(b_ptrs + k0, mask=(cols[None, :] < n) & (ks[:, None] < d - k0), other=0.0)
        g = _dot(a, b, g, DOT, INTERPRET)
    return g


@triton.jit
def _pair_term(g, sq_sum, neg_inv_tau, clamp, VARIANT: tl.constexpr, ROWS: tl.constexpr):
    """The pair's term t(g), as dispersion.py's ``_<variant>_term_`` (logits for log-sum-exp variants);
    for raw rows (the spec's ``rows``) the distance logit -D / tau, D = sq_sum - 2 g.

    Products by constants, never divisions: Triton's fp32 division is approximate, and a
    zero vector's angle pi/2 must give orthogonalization's hinge exactly 0, as in torch.
    """
    if VARIANT == "decorrelation":
        t = g * g
    elif ROWS == "raw":
        t = (sq_sum - 2.0 * g) * neg_inv_tau
    else:
        c = tl.minimum(tl.maximum(g, clamp - 1.0), 1.0 - clamp)
        angle = _arccos(c)
        if VARIANT == "angular_spread":
            t = angle * (_INV_PI * neg_inv_tau)
        else:
            h = tl.maximum((_HALF_PI - angle) * _INV_PI, 0.0)
            t = h * h
    return t


@triton.jit
def _pair_weight(g, sq_sum, valid, m, log_s, neg_inv_tau, clamp, pair_scale, VARIANT: tl.constexpr,
                 ROWS: tl.constexpr):  # fmt: skip
    """W = dL/dg of the unordered pair where ``valid``, else 0; as dispersion.py's ``_<variant>_grad_``.

    pair_scale = 4 / pairs. Invalid logits are masked before exp: the diagonal and the
    padding of l2_repel have logits far above the maximum m, whose exp would overflow.
    """
    if VARIANT == "decorrelation":
        w = g * pair_scale
    elif VARIANT == "l2_repel":
        t = tl.where(valid, _pair_term(g, sq_sum, neg_inv_tau, 0.0, VARIANT, ROWS), -float("inf"))
        w = tl.exp((t - m) - log_s) * (-4.0 * neg_inv_tau)
    else:
        c = tl.minimum(tl.maximum(g, clamp - 1.0), 1.0 - clamp)
        angle = _arccos(c)
        slope = tl.div_rn(_INV_PI, tl.sqrt_rn(1.0 - c * c))  # -dD/dc at the clamped c: straight-through
        if VARIANT == "angular_spread":
            w = tl.exp((angle * (_INV_PI * neg_inv_tau) - m) - log_s) * slope * (-2.0 * neg_inv_tau)
        else:
            w = tl.maximum((_HALF_PI - angle) * _INV_PI, 0.0) * slope * pair_scale
    return tl.where(valid, w, 0.0)


@triton.jit
def _entropy_terms(p, eps):
    """perplexity_entropy's f(p) = p log2(p + eps) and p f'(p), 0 where p = 0 (variants.row_entropy_terms)."""
    log = tl.log2(p + eps)
    f = tl.where(p > 0, p * log, 0.0)
    pf = tl.where(p > 0, p * (log + tl.div_rn(p, (p + eps) * _LN2)), 0.0)
    return f, pf


@triton.jit
def _entropy_weight(t, valid, m_r, ls_r, a_r, m_c, ls_c, a_c, eps, pair_scale):
    """perplexity_entropy's W = dL/dg of the unordered pair from its logit t = -D / tau:
    pair_scale (p f' - p a) summed over both orientations (p_j|i with row i's softmax, p_i|j with j's)."""
    t = tl.where(valid, t, -float("inf"))
    p_ij = tl.exp((t - m_r[:, None]) - ls_r[:, None])
    p_ji = tl.exp((t - m_c[None, :]) - ls_c[None, :])
    _, pf_ij = _entropy_terms(p_ij, eps)
    _, pf_ji = _entropy_terms(p_ji, eps)
    w = (pf_ij - p_ij * a_r[:, None] + pf_ji - p_ji * a_c[None, :]) * pair_scale
    return tl.where(valid, w, 0.0)


@triton.jit
def _sq_sum(sq_seq, rows, cols, n, ROWS: tl.constexpr):
    """|x_i|^2 + |x_j|^2 of the tile for raw rows (sq_seq: the sequence's squared norms), else 0."""
    sq_sum = 0.0
    if ROWS == "raw":
        sq_rows = tl.load(sq_seq + rows, mask=rows < n, other=0.0)
        sq_cols = tl.load(sq_seq + cols, mask=cols < n, other=0.0)
        sq_sum = sq_rows[:, None] + sq_cols[None, :]
    return sq_sum


# ----------------------------------------------------------------------------- kernels


@triton.jit
def _rows_kernel(
    z_ptr, mean_ptr, u_ptr, stat_ptr, sq_ptr, n, d, guard, unit_eps,
    ROWS: tl.constexpr, STORE_BF16: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One token row: the stored row u and two scalars.

    unit / centred rows: u = x / stat, x = z (minus its feature mean if centred),
    stat = max(|x|, guard) + unit_eps (the released form's |z| + 1e-2 for unit rows);
    sq = |u|^2 of the stored u (for an exact projection).
    raw rows (l2_repel, perplexity_entropy): u = z - mean token of the sequence; stat = |z|^2 (the norm
    penalty); sq = |u|^2 of the stored u, so that D = sq_i + sq_j - 2 g is the distance
    of the stored rows themselves.
    """
    row = tl.program_id(0).to(tl.int64)
    feats = tl.arange(0, BLOCK_D)
    inside = feats < d
    z = tl.load(z_ptr + row * d + feats, mask=inside, other=0.0).to(tl.float32)
    if ROWS == "raw":
        x = z - tl.load(mean_ptr + (row // n) * d + feats, mask=inside, other=0.0)
        stat = tl.sum(z * z)
    else:
        x = z
        if ROWS == "centred":
            x = tl.where(inside, z - tl.sum(z) / d, 0.0)
        stat = tl.maximum(tl.sqrt_rn(tl.sum(x * x)), guard) + unit_eps
        x = tl.div_rn(x, stat)
    u = _stored(x, STORE_BF16, INTERPRET)
    tl.store(u_ptr + row * d + feats, u, mask=inside)
    u32 = u.to(tl.float32)
    tl.store(stat_ptr + row, stat)
    tl.store(sq_ptr + row, tl.sum(u32 * u32))


@triton.jit
def _pairs_forward_kernel(
    u_ptr, sq_ptr, m_ptr, s_ptr, n, d, neg_inv_tau, clamp,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, LOGSUMEXP: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One upper-triangle tile pair of sequence b: (max, sum exp(t - max)) or the sum of t, at [b, pair]."""
    tiles = tl.cdiv(n, BLOCK)
    ti, tj = _tile_pair(tiles)
    b = tl.program_id(1).to(tl.int64)
    rows = ti * BLOCK + tl.arange(0, BLOCK)
    cols = tj * BLOCK + tl.arange(0, BLOCK)
    g = _gram_tile(u_ptr + b * n * d, rows, cols, n, d, DOT, INTERPRET, BLOCK, BLOCK_K)
    t = _pair_term(g, _sq_sum(sq_ptr + b * n, rows, cols, n, ROWS), neg_inv_tau, clamp, VARIANT, ROWS)
    valid = (rows[:, None] < cols[None, :]) & (cols[None, :] < n)
    out = b * tl.num_programs(0) + tl.program_id(0)
    if LOGSUMEXP:
        t = tl.where(valid, t, -float("inf"))
        tile_max = tl.max(tl.max(t, axis=1), axis=0)
        shift = tl.where(tile_max == -float("inf"), 0.0, tile_max)  # a tile without pairs sums to 0
        tl.store(m_ptr + out, tile_max)
        tl.store(s_ptr + out, tl.sum(tl.sum(tl.exp(t - shift), axis=1), axis=0))
    else:
        tl.store(s_ptr + out, tl.sum(tl.sum(tl.where(valid, t, 0.0), axis=1), axis=0))


@triton.jit
def _pairs_backward_kernel(
    u_ptr, sq_ptr, m_ptr, log_s_ptr, a_ptr, w_ptr, r_ptr, n, d, neg_inv_tau, clamp, pair_scale, entropy_eps,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, ROW_ENTROPY: tl.constexpr, LOGSUMEXP: tl.constexpr,
    DOT: tl.constexpr, STORE_BF16: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """One tile pair of sequence b recomputed: W into w[b] at (rows, cols) and (cols, rows), and
    the tile's radial partials r[b, tj, rows] and r[b, ti, cols] (sum_j W_ij g_ij, or sum_j W_ij).

    m, log_s: per sequence [B] for the log-sum-exp variants; per token [B, N] (with a) for the
    row-entropy ones (perplexity_entropy), whose row softmaxes ``_row_entropy_kernel`` summarised."""
    tiles = tl.cdiv(n, BLOCK)
    ti, tj = _tile_pair(tiles)
    b = tl.program_id(1).to(tl.int64)
    rows = ti * BLOCK + tl.arange(0, BLOCK)
    cols = tj * BLOCK + tl.arange(0, BLOCK)
    m = 0.0
    log_s = 0.0
    if LOGSUMEXP:
        m = tl.load(m_ptr + b)
        log_s = tl.load(log_s_ptr + b)
    g = _gram_tile(u_ptr + b * n * d, rows, cols, n, d, DOT, INTERPRET, BLOCK, BLOCK_K)
    valid = (rows[:, None] != cols[None, :]) & (rows[:, None] < n) & (cols[None, :] < n)
    sq_sum = _sq_sum(sq_ptr + b * n, rows, cols, n, ROWS)
    if ROW_ENTROPY:
        tok = b * n
        in_r = rows < n
        in_c = cols < n
        w = _entropy_weight(
            _pair_term(g, sq_sum, neg_inv_tau, 0.0, VARIANT, ROWS), valid,
            tl.load(m_ptr + tok + rows, mask=in_r, other=0.0), tl.load(log_s_ptr + tok + rows, mask=in_r, other=0.0),
            tl.load(a_ptr + tok + rows, mask=in_r, other=0.0), tl.load(m_ptr + tok + cols, mask=in_c, other=0.0),
            tl.load(log_s_ptr + tok + cols, mask=in_c, other=0.0), tl.load(a_ptr + tok + cols, mask=in_c, other=0.0),
            entropy_eps, pair_scale,
        )  # fmt: skip
    else:
        w = _pair_weight(g, sq_sum, valid, m, log_s, neg_inv_tau, clamp, pair_scale, VARIANT, ROWS)
    w = _stored(w, STORE_BF16, INTERPRET)
    in_tile = (rows[:, None] < n) & (cols[None, :] < n)
    w_seq = w_ptr + b * n * n
    tl.store(w_seq + rows[:, None] * n + cols[None, :], w, mask=in_tile)
    w32 = w.to(tl.float32)  # the radial terms use W as stored, as W U will
    radial = w32
    if ROWS != "raw":
        radial = w32 * g
    r_seq = r_ptr + b * tiles * n
    tl.store(r_seq + tj * n + rows, tl.sum(radial, axis=1), mask=rows < n)
    if ti != tj:
        tl.store(w_seq + cols[:, None] * n + rows[None, :], tl.trans(w), mask=tl.trans(in_tile))
        tl.store(r_seq + ti * n + cols, tl.sum(radial, axis=0), mask=cols < n)


@triton.jit
def _pair_logits_kernel(
    u_ptr, sq_ptr, t_ptr, n, d, neg_inv_tau,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """A row-entropy variant's forward (perplexity_entropy), one upper-triangle tile pair of
    sequence b: the logits -D / tau (diagonal -inf) into t[b] at (rows, cols) and (cols, rows),
    for ``_row_entropy_kernel``."""
    tiles = tl.cdiv(n, BLOCK)
    ti, tj = _tile_pair(tiles)
    b = tl.program_id(1).to(tl.int64)
    rows = ti * BLOCK + tl.arange(0, BLOCK)
    cols = tj * BLOCK + tl.arange(0, BLOCK)
    g = _gram_tile(u_ptr + b * n * d, rows, cols, n, d, DOT, INTERPRET, BLOCK, BLOCK_K)
    t = _pair_term(g, _sq_sum(sq_ptr + b * n, rows, cols, n, ROWS), neg_inv_tau, 0.0, VARIANT, ROWS)
    t = tl.where(rows[:, None] == cols[None, :], -float("inf"), t)
    in_tile = (rows[:, None] < n) & (cols[None, :] < n)
    t_seq = t_ptr + b * n * n
    tl.store(t_seq + rows[:, None] * n + cols[None, :], t, mask=in_tile)
    if ti != tj:
        tl.store(t_seq + cols[:, None] * n + rows[None, :], tl.trans(t), mask=tl.trans(in_tile))


@triton.jit
def _row_entropy_kernel(
    t_ptr, m_ptr, log_s_ptr, e_ptr, a_ptr, n, entropy_eps, ROWS: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    """ROWS token rows of sequence b from their logits t: the row's softmax max m and log-sum log_s
    (one sweep, online), then (a second sweep) sum_j f(p_ij) and a_i = sum_j p_ij f'(p_ij).

    Two sweeps over the [ROWS, N] logits in memory, no products: the log2(p + eps) of the
    released form does not factor through a running sum, so p needs the finished row LSE."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    b = tl.program_id(1).to(tl.int64)
    ks = tl.arange(0, COLS)
    in_rows = rows < n
    row_ptrs = t_ptr + b * n * n + rows[:, None] * n
    m = tl.full((ROWS,), -float("inf"), tl.float32)
    s = tl.zeros((ROWS,), dtype=tl.float32)
    for k0 in range(0, n, COLS):
        t = tl.load(row_ptrs + (k0 + ks)[None, :], mask=in_rows[:, None] & (ks[None, :] < n - k0), other=-float("inf"))
        m_new = tl.maximum(m, tl.max(t, axis=1))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(t - shift[:, None]), axis=1)
        m = m_new
    log_s = tl.log(s)
    e = tl.zeros((ROWS,), dtype=tl.float32)
    a = tl.zeros((ROWS,), dtype=tl.float32)
    for k0 in range(0, n, COLS):
        t = tl.load(row_ptrs + (k0 + ks)[None, :], mask=in_rows[:, None] & (ks[None, :] < n - k0), other=-float("inf"))
        f, pf = _entropy_terms(tl.exp((t - m[:, None]) - log_s[:, None]), entropy_eps)
        e += tl.sum(f, axis=1)
        a += tl.sum(pf, axis=1)
    out = b * n + rows
    tl.store(m_ptr + out, m, mask=in_rows)
    tl.store(log_s_ptr + out, log_s, mask=in_rows)
    tl.store(e_ptr + out, e, mask=in_rows)
    tl.store(a_ptr + out, a, mask=in_rows)


@triton.jit
def _dz_kernel(
    w_ptr, u_ptr, r_ptr, stat_ptr, sq_ptr, z_ptr, dz_ptr, grad_ptr, n, d, tiles, inv_batch, guard, unit_eps,
    norm_coeff,
    ROWS: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """dz[b, rows, feats] from du = W u (one pass over the sequence's tokens) and the row scalars.

    unit / centred rows, u = x / stat, stat = |x| + unit_eps: dz_i = s (du_i - u_i r_i
    |x_i| / (|u_i|^2 stat_i)) / stat_i (for unit_eps = 0 the projection on the stored u),
    the radial part dropped where |x_i| was clamped (for centred rows the centring's
    backward is a no-op: du and u are combinations of centred rows). raw rows:
    dz_i = s (du_i - u_i r_i + norm_coeff z_i). s = grad_out / B.
    """
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    feats = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    b = tl.program_id(2).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    w_seq = w_ptr + b * n * n
    u_seq = u_ptr + b * n * d
    in_rows = rows < n
    in_feats = feats < d
    du = tl.zeros((BLOCK, BLOCK_D), dtype=tl.float32)
    for k0 in range(0, n, BLOCK_K):
        w = tl.load(w_seq + rows[:, None] * n + (k0 + ks)[None, :], mask=in_rows[:, None] & (ks[None, :] < n - k0),
                    other=0.0)  # fmt: skip
        u = tl.load(u_seq + (k0 + ks)[:, None] * d + feats[None, :], mask=(ks[:, None] < n - k0) & in_feats[None, :],
                    other=0.0)  # fmt: skip
        du = _dot(w, u, du, DOT, INTERPRET)
    r = tl.zeros((BLOCK,), dtype=tl.float32)
    for slot in range(0, tiles):
        r += tl.load(r_ptr + (b * tiles + slot) * n + rows, mask=in_rows, other=0.0)
    here = in_rows[:, None] & in_feats[None, :]
    offsets = b * n * d + rows[:, None] * d + feats[None, :]
    u_rows = tl.load(u_ptr + offsets, mask=here, other=0.0).to(tl.float32)
    stat = tl.load(stat_ptr + b * n + rows, mask=in_rows, other=1.0)
    scale = tl.load(grad_ptr) * inv_batch
    if ROWS == "raw":
        z = tl.load(z_ptr + offsets, mask=here, other=0.0).to(tl.float32)
        dz = (du - u_rows * r[:, None] + norm_coeff * z) * scale
    else:
        sq = tl.load(sq_ptr + b * n + rows, mask=in_rows, other=1.0)
        norm = stat - unit_eps
        radial = tl.where(norm <= guard, 0.0, tl.div_rn(r * norm, tl.maximum(sq, 1e-30) * stat))
        dz = (du - u_rows * radial[:, None]) * tl.div_rn(scale, stat)[:, None]
    tl.store(dz_ptr + offsets, dz.to(dz_ptr.dtype.element_ty), mask=here)


# ----------------------------------------------------------------------------- host side


class _Rows(NamedTuple):
    """The stored rows of a batch and their per-token scalars (see ``_rows_kernel``)."""

    u: Tensor
    stat: Tensor
    sq: Tensor


def _guard(spec: VariantSpec, d: int) -> float:
    """The norm guard: NORM_EPS, or sqrt(d-1) NORM_EPS for decorrelation's std (see dispersion.py)."""
    return NORM_EPS * math.sqrt(d - 1) if spec.rows == "centred" else NORM_EPS


def _make_rows(hidden: Tensor, spec: VariantSpec, hp: PairHyper, store_bf16: bool) -> _Rows:
    b, n, d = hidden.shape
    u = torch.empty(b, n, d, device=hidden.device, dtype=torch.bfloat16 if store_bf16 else torch.float32)
    stat = torch.empty(b, n, device=hidden.device)
    sq = torch.empty(b, n, device=hidden.device)
    mean = hidden.mean(dim=1, dtype=torch.float32) if spec.rows == "raw" else stat
    _rows_kernel[(b * n,)](
        hidden, mean, u, stat, sq, n, d, _guard(spec, d), hp.unit_eps(spec),
        ROWS=spec.rows, STORE_BF16=store_bf16, INTERPRET=INTERPRETED,
        BLOCK_D=triton.next_power_of_2(d), num_warps=1 if INTERPRETED else 4,
    )  # fmt: skip
    return _Rows(u, stat, sq)


def _pair_autotune(kernel: triton.JITFunction) -> triton.runtime.Autotuner:
    """A pair kernel autotuned over PAIR_CONFIGS (its square tile stays the caller's BLOCK)."""
    configs = [triton.Config({"BLOCK_K": k}, num_warps=w, num_stages=st) for k, w, st in PAIR_CONFIGS]
    return triton.autotune(configs=configs, key=["n", "d"])(kernel)


_TUNED = {
    "forward": _pair_autotune(_pairs_forward_kernel),
    "backward": _pair_autotune(_pairs_backward_kernel),
    "dz": triton.autotune(
        [triton.Config({"BLOCK": b, "BLOCK_K": k, "BLOCK_D": bd}, num_warps=w, num_stages=st)
         for b, k, bd, w, st in DZ_CONFIGS],
        key=["n", "d"],
    )(_dz_kernel),
}  # fmt: skip
_TUNED["logits"] = _pair_autotune(_pair_logits_kernel)
_JIT = {"forward": _pairs_forward_kernel, "backward": _pairs_backward_kernel, "dz": _dz_kernel,
        "logits": _pair_logits_kernel}  # fmt: skip

# _row_entropy_kernel's (ROWS, COLS, num_warps): no products, so one fixed shape; the
# interpreter's is small so that test sizes have partial row and column blocks.
ROW_ENTROPY_TILES = (16, 32, 1) if INTERPRETED else (16, 128, 8)


def _pairs(tiles: int) -> int:
    return tiles * (tiles + 1) // 2


@dataclass(frozen=True)
class TritonTiles:
    """The exact loss in the fused kernels above; a ``PairKernel`` of dispersion.py.

    ``precision``: one of PRECISIONS. ``tiles``: a fixed TileConfig instead of autotune
    over PAIR_CONFIGS and DZ_CONFIGS (under the interpreter, INTERPRETER_TILES unless given).
    ``max_weight_bytes`` bounds the backward's [sequences, N, N] weight buffer.
    """

    precision: str = "auto"
    tiles: TileConfig | None = None
    max_weight_bytes: int = MAX_WEIGHT_BYTES

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")

    def loss(self, hidden: Tensor, spec: VariantSpec, hp: PairHyper, lambda_norm: float) -> Tensor:
        _check_device(hidden.device)
        return _TritonPairLoss.apply(hidden.contiguous(), spec, hp, lambda_norm, self)

    def fixed_tiles(self) -> TileConfig | None:
        return self.tiles or (INTERPRETER_TILES if INTERPRETED else None)

    def block(self, n: int) -> int:
        """The pair tile of every kernel for sequences of n tokens."""
        fixed = self.fixed_tiles()
        return fixed.block if fixed else pair_block(n)

    def launch(self, name: str, grid, *args, **constexprs) -> None:
        """Launch kernel ``name``: with fixed tiles, or autotuned; ``grid`` maps the tile sizes to the grid."""
        fixed = self.fixed_tiles()
        if fixed is None:
            _TUNED[name][grid](*args, **constexprs)
            return
        meta = {"BLOCK": fixed.block, "BLOCK_K": fixed.block_k}
        if name == "dz":
            meta["BLOCK_D"] = fixed.block_d
        _JIT[name][grid({**constexprs, **meta})](*args, **{**constexprs, **meta}, num_warps=fixed.num_warps)


class _TritonPairLoss(torch.autograd.Function):
    """Forward: rows, then the triangle's partials (perplexity_entropy: its logits, then per-row sweeps).
    Backward: rows and triangle again, W once, dz = f(W U).

    Saves only ``hidden`` and two scalars per sequence (perplexity_entropy: three per token);
    autocast is off inside.
    """

    @staticmethod
    def forward(
        ctx, hidden: Tensor, spec: VariantSpec, hp: PairHyper, lambda_norm: float, tiles: TritonTiles
    ) -> Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            b, n, d = hidden.shape
            plan = products(tiles.precision, spec)
            rows = _make_rows(hidden, spec, hp, plan.store_bf16)
            ctx.spec, ctx.hp, ctx.lambda_norm, ctx.tiles = spec, hp, lambda_norm, tiles
            if spec.row_entropy:
                stats = _row_entropy(rows, hidden, spec, hp, tiles, plan)
                ctx.save_for_backward(hidden, stats[0], stats[1], stats[3])
                per_seq = stats[2].mean(dim=1)
            else:
                per_seq = _pair_sums(ctx, rows, hidden, spec, hp, tiles, plan)
            if spec.norm_penalty:
                per_seq = per_seq + rows.stat.sum(dim=1) * (lambda_norm / (n * d))
            return per_seq.mean()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        hidden, *saved = ctx.saved_tensors
        spec, hp, tiles = ctx.spec, ctx.hp, ctx.tiles
        with torch.autocast(hidden.device.type, enabled=False):
            plan = products(tiles.precision, spec)
            rows = _make_rows(hidden, spec, hp, plan.store_bf16)
            dz = torch.empty_like(hidden)
            grad = grad_out.reshape(1).float()
            stats = (*saved, rows.stat)[:3] if saved else (rows.stat, rows.stat, rows.stat)  # (m, log_s, a)
            for b0, b1 in _sequence_groups(hidden, rows.u.element_size(), tiles.max_weight_bytes):
                _weights_and_dz(rows, stats, hidden, dz, grad, b0, b1, spec, hp, ctx.lambda_norm, tiles, plan)
        return dz, None, None, None, None


def _pair_sums(ctx, rows: _Rows, hidden: Tensor, spec: VariantSpec, hp: PairHyper, tiles: TritonTiles,
               plan: _Products) -> Tensor:  # fmt: skip
    """The per-sequence loss of the pair-sum variants from the triangle's partials; saves what backward needs."""
    b, n, d = hidden.shape
    block = tiles.block(n)
    pair_count = _pairs(triton.cdiv(n, block))
    m_part = torch.empty(b, pair_count, device=hidden.device)
    s_part = torch.empty(b, pair_count, device=hidden.device)
    tiles.launch(
        "forward", lambda meta: (pair_count, b), rows.u, rows.sq, m_part, s_part, n, d, -1.0 / hp.tau,
        hp.clamp, VARIANT=spec.name, ROWS=spec.rows, LOGSUMEXP=spec.logsumexp, DOT=plan.dot, INTERPRET=INTERPRETED,
        BLOCK=block,
    )  # fmt: skip
    if not spec.logsumexp:
        ctx.save_for_backward(hidden)
        return s_part.sum(dim=1) * (2.0 / hp.pairs)
    lse = OnlineLogSumExp(b, hidden.device)
    lse.add_partials(m_part, s_part)
    m, log_s = lse.finish(hp.diagonal_terms(spec, n))
    ctx.save_for_backward(hidden, m, log_s)
    return m + log_s - math.log(hp.pairs) + hp.constant(spec, n)


def _row_entropy(rows: _Rows, hidden: Tensor, spec: VariantSpec, hp: PairHyper, tiles: TritonTiles,
                 plan: _Products) -> tuple[Tensor, ...]:  # fmt: skip
    """perplexity_entropy's per-token (m, log_s, sum_j f(p_ij), a_i), each [B, N]: the triangle's logits
    into a [sequences, N, N] fp32 buffer (in groups within max_weight_bytes), then the row sweeps."""
    b, n, d = hidden.shape
    block = tiles.block(n)
    block_rows, cols, warps = ROW_ENTROPY_TILES
    stats = tuple(torch.empty(b, n, device=hidden.device) for _ in range(4))
    for b0, b1 in _sequence_groups(hidden, 4, tiles.max_weight_bytes):
        logits = torch.empty(b1 - b0, n, n, device=hidden.device)
        tiles.launch(
            "logits", lambda meta: (_pairs(triton.cdiv(n, block)), b1 - b0), rows.u[b0:b1], rows.sq[b0:b1], logits,
            n, d, -1.0 / hp.tau, VARIANT=spec.name, ROWS=spec.rows, DOT=plan.dot, INTERPRET=INTERPRETED, BLOCK=block,
        )  # fmt: skip
        _row_entropy_kernel[(triton.cdiv(n, block_rows), b1 - b0)](
            logits, *(s[b0:b1] for s in stats), n, hp.eps, ROWS=block_rows, COLS=cols, num_warps=warps,
        )  # fmt: skip
    return stats


def _weights_and_dz(rows: _Rows, stats: tuple[Tensor, Tensor, Tensor], hidden: Tensor, dz: Tensor, grad: Tensor,
                    b0: int, b1: int, spec: VariantSpec, hp: PairHyper, lambda_norm: float, tiles: TritonTiles,
                    plan: _Products) -> None:  # fmt: skip
    """Sequences [b0, b1): W and the radial partials, then dz (in place). ``stats``: (m, log_s, a),
    per sequence or per token (perplexity_entropy), placeholders for the variants without."""
    n, d = hidden.shape[1:]
    count = b1 - b0
    block = tiles.block(n)
    tile_count = triton.cdiv(n, block)
    w = torch.empty(count, n, n, device=hidden.device, dtype=rows.u.dtype)
    radial = torch.empty(count, tile_count, n, device=hidden.device)
    u, sq = rows.u[b0:b1], rows.sq[b0:b1]
    pair_scale = 2.0 / (hp.tau * n) if spec.row_entropy else 4.0 / hp.pairs
    tiles.launch(
        "backward", lambda meta: (_pairs(tile_count), count),
        u, sq, *(s[b0:b1] for s in stats), w, radial, n, d, -1.0 / hp.tau, hp.clamp, pair_scale, hp.eps,
        VARIANT=spec.name, ROWS=spec.rows, ROW_ENTROPY=spec.row_entropy, LOGSUMEXP=spec.logsumexp, DOT=plan.dot,
        STORE_BF16=plan.store_bf16, INTERPRET=INTERPRETED, BLOCK=block,
    )  # fmt: skip
    tiles.launch(
        "dz", lambda meta: (triton.cdiv(n, meta["BLOCK"]), triton.cdiv(d, meta["BLOCK_D"]), count),
        w, u, radial, rows.stat[b0:b1], sq, hidden[b0:b1], dz[b0:b1], grad, n, d, tile_count,
        1.0 / hidden.shape[0], _guard(spec, d), hp.unit_eps(spec), 2.0 * lambda_norm * spec.norm_penalty / (n * d),
        ROWS=spec.rows, DOT=plan.wu_dot, INTERPRET=INTERPRETED,
    )  # fmt: skip


def _sequence_groups(hidden: Tensor, element_bytes: int, max_bytes: int) -> list[tuple[int, int]]:
    """[b0, b1) groups of sequences whose [group, N, N] weight buffer fits ``max_bytes`` (at least one)."""
    b, n = hidden.shape[:2]
    per_group = max(1, max_bytes // (n * n * element_bytes))
    return [(b0, min(b0 + per_group, b)) for b0 in range(0, b, per_group)]


def _check_device(device: torch.device) -> None:
    """Refuse tensors the kernels cannot run on, saying how to run them."""
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton dispersion kernels need a CUDA tensor, got one on {device}; to run them on CPU, "
            "set TRITON_INTERPRET=1 before the process first uses them (or use kernel='torch')"
        )
