"""The exact dispersion loss in fused Triton kernels, at its FLOP floor of about 4·B·N²·d.

The loss is a function of each sequence's Gram matrix g = U U^T; its gradient is
dU = W U with W = dL/dg symmetric. The floor is the Gram triangle forward (N²d), its
recompute backward (N²d) and W U (2N²d). In the style of flash attention:

- ``_rows_kernel`` (forward, and again backward: recomputed, not saved): one program per
  token: u = z / |z| (centred over features for decorrelation; for l2_repel and
  perplexity_entropy the sequence's mean token subtracted, which leaves distances unchanged
  and keeps low-precision products safe), stored as the products read it (bf16, bf16 hi and
  lo parts, or fp32), with the per-token scalars the rest needs;
- ``_pairs_forward_kernel``: a persistent grid over every sequence's upper-triangle tile
  pairs (ti <= tj): the Gram tile from TMA loads by ``tl.dot``, the variant's term in two
  column halves (fewer live registers), one partial (max, sum exp) or sum per tile pair,
  combined by torch (online log-sum-exp, no atomics);
- ``_pairs_backward_kernel``: the same tiles recomputed; W stored by TMA once per tile pair
  (the tile and its transpose) into a [sequences, N, N] buffer, plus per-token partials of
  the radial term r_i = sum_j W_ij g_ij (sum_j W_ij for raw rows), one slot per tile: no atomics;
- dU = W U by cuBLAS (``torch.bmm`` with an fp32 result: bf16 operands, three products for
  hi and lo parts), then ``_radial_kernel``: per token, the backward through the rows (the
  radial projection, 1/|z|, the loss's scale, the cast to the hidden states' dtype).

perplexity_entropy's forward writes the triangle's logits (``_pair_logits_kernel``) for the
per-row sweeps of ``_row_entropy_kernel``. Under ``TRITON_INTERPRET=1`` (CPU) the same kernels
run in Triton's interpreter, with bf16 products emulated exactly in fp32 (its own bf16 casts and
dots are not IEEE), and W U in fp32 torch products of the bf16 values.
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
from triton.tools.tensor_descriptor import TensorDescriptor

from dispersion_titan.losses.variants import OnlineLogSumExp, PairHyper, PairLoss, VariantSpec

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
    """The tiles of every kernel: fixed ones (the interpreter's, or a test's) or the GPU's, autotuned."""

    block: int  # pair tiles are block x block
    block_k: int  # features per Gram step
    slices: int  # the epilogue's column slices per tile (1, 2 or 4)
    num_warps: int  # 0: autotuned over PAIR_CONFIGS (the GPU's tiles)


# The GPU's square pair tile: 128 x 128 (64 FLOP per byte loaded, twice 64 x 64's), its epilogue
# in GPU_SLICES column slices so that the arccos and exp math does not spill (compiled for sm_90 as
# a launch binds it in tests/test_dispersion_kernel.py). One size for the forward and backward:
# the triangle's indexing and the radial slots depend on it.
GPU_BLOCK = 128
GPU_SLICES = 4
# exact's fp32 products of raw rows run on the CUDA cores, whose 128 x 128 accumulator spills: 64 x 64
# tiles, 64-byte Gram steps.
IEEE_BLOCK = 64
# A Gram step loads 128 bytes of each row and part (64 bf16 or 32 fp32 features; bf16x3's hi and lo:
# 32 each): one TMA box of the 128-byte swizzle that wgmma reads without bank conflicts.
STEP_BYTES = 128
# Persistent programs per multiprocessor: two, so that one's epilogue can overlap the other's
# products where registers and shared memory let two stay resident.
PROGRAMS_PER_SM = 2
# The pair kernels' persistent-loop bound (tile pairs): Triton specialises an integer divisible by 16,
# which buys a loop bound nothing and would build every pair kernel twice across shapes.
PERSISTENT_BOUND = ["items"]

# What autotune tries on a GPU, per (N, d, variant, products): (num_warps, num_stages) of the pair
# kernels. Every configuration is compiled for sm_90 as a launch builds it in
# tests/test_dispersion_kernel.py, which asserts no register spills, wgmma fed by TMA and shared
# memory within the limit: 4 stages spill perplexity_entropy's backward, and a 128-register cap (two
# programs per multiprocessor) spills three backwards. No warp specialisation: Triton 3.6 and 3.9
# build no partitions for sm_90 from tl.range(warp_specialize=True), not even for a plain matmul.
PAIR_CONFIGS = ((8, 3), (8, 2))
# Token rows per program of the per-token kernels (rows, radial): memory-bound on a GPU, and the
# interpreter's cost is per program.
ROWS_PER_PROGRAM = 16 if INTERPRETED else 2

# Under the interpreter each tl op costs about the same whatever its size: small tiles
# exercise the masking of partial tiles at test sizes.
INTERPRETER_TILES = TileConfig(16, 32, 2, 1)


class _Products(NamedTuple):
    """How one precision setting computes: storage of U, the pair products, and W."""

    rows: str  # U stored as "bf16", "split" (bf16 hi and lo parts, hi + lo = U to 16 bits) or "fp32"
    dot: str  # the pair products: "bf16", "bf16x3" (lo.hi + hi.lo + hi.hi of the stored parts), "tf32", "ieee"
    split_weights: bool  # W stored as bf16 hi and lo parts and W U as four bf16 products, else one


def products(precision: str, spec: VariantSpec) -> _Products:
    """The storage and product precision of a PRECISIONS setting for a variant."""
    if precision == "auto" and spec.row_entropy:
        # Each row's softmax at sigma^2 = tau is sharp: bf16 rows put errors of ~0.5 into its
        # logits at d 64 (15% in the gradient), so its Gram products are bf16x3 on the rows
        # centred on their sequence's mean token (about 16 bits of each row); W and W U in bf16.
        return _Products("split", "bf16x3", False)
    if precision in ("auto", "bf16"):
        return _Products("bf16", "bf16", False)
    if precision == "tf32":
        return _Products("fp32", "tf32", True)
    return _Products("fp32", "ieee", True) if spec.rows == "raw" else _Products("split", "bf16x3", True)


# ----------------------------------------------------------------------------- shared device code


@triton.jit
def _arccos(x):
    """arccos(x) for x in [-1, 1] (Abramowitz & Stegun 4.4.46, reflected for x < 0).

    arccos(|x|) = sqrt(1 - |x|) * P7(|x|), |error| <= 2e-8 in exact arithmetic; in
    fp32 the max abs error against float64 arccos is below 5e-7 on [-1, 1]
    (tests/test_dispersion_kernel.py measures it on a dense grid). The square root is the
    GPU's approximate one (its argument is at least the clamp); P7(0) is pi/2 rounded like
    torch's arccos(0).
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
    r = tl.sqrt(1.0 - a) * p
    return tl.where(x < 0, _PI - r, r)


@triton.jit
def _bf16_in_fp32(x):
    """x rounded to bf16 (to nearest even), kept as fp32: the interpreter's own bf16 casts
    round half up and drop the carry, and its dot multiplies bf16 tiles as their uint16 storage."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _tf32_truncated(x):
    """x as the tensor cores read an fp32 operand of a plain "tf32" product: its 13 low mantissa bits
    dropped (truncated toward zero, not rounded: tl.dot's documentation warns of the bias), kept as fp32."""
    bits = x.to(tl.uint32, bitcast=True)
    return (bits & 0xFFFFE000).to(tl.float32, bitcast=True)


@triton.jit
def _bf16(x, INTERPRET: tl.constexpr):
    """fp32 x rounded to bf16 (to nearest even)."""
    if INTERPRET:
        return _bf16_in_fp32(x).to(tl.bfloat16)
    return x.to(tl.bfloat16)


@triton.jit
def _dot(a, b, acc, DOT: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + a @ b with fp32 accumulation: bf16 operands for DOT "bf16", else fp32 operands
    multiplied in tl.dot's input precision DOT ("tf32", "ieee").

    The interpreter multiplies in fp32: exactly the bf16 products for stored bf16 operands;
    tf32 with its operands truncated to tf32, as the GPU's tensor cores read them.
    """
    if INTERPRET:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        if DOT == "tf32":
            a = _tf32_truncated(a)
            b = _tf32_truncated(b)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    elif DOT == "bf16":
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=DOT)
    return acc


@triton.jit
def _work_item(item, pairs, tiles):
    """Work item -> (sequence, ti, tj), ti <= tj: each sequence's tile pairs in turn, row tile 0's first."""
    b = item // pairs
    q = pairs - 1 - item % pairs  # counts the sequence's pairs in reverse
    k = ((tl.sqrt((8 * q + 1).to(tl.float32)) - 1.0) * 0.5).to(tl.int32)
    k = tl.where((k + 1) * (k + 2) // 2 <= q, k + 1, k)  # the float root may be one off
    k = tl.where(k * (k + 1) // 2 > q, k - 1, k)
    ti = tiles - 1 - k
    return b, ti, ti + (q - k * (k + 1) // 2)


@triton.jit
def _gram_tile(u_desc, b, r0, c0, d, DOT: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
               BLOCK_K: tl.constexpr):  # fmt: skip
    """g = u_rows . u_cols^T [BLOCK, BLOCK] of sequence b, rows from r0 and columns from c0; TMA
    fills rows >= n and features >= d with 0. u_desc: [parts, sequences, N, d], bf16x3's hi and lo."""
    g = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, d, BLOCK_K):
        a = u_desc.load([0, b, r0, k0]).reshape(BLOCK, BLOCK_K)
        c = tl.trans(u_desc.load([0, b, c0, k0]).reshape(BLOCK, BLOCK_K))
        if DOT == "bf16x3":  # the small products first
            a_lo = u_desc.load([1, b, r0, k0]).reshape(BLOCK, BLOCK_K)
            c_lo = tl.trans(u_desc.load([1, b, c0, k0]).reshape(BLOCK, BLOCK_K))
            g = _dot(a_lo, c, g, "bf16", INTERPRET)
            g = _dot(a, c_lo, g, "bf16", INTERPRET)
            g = _dot(a, c, g, "bf16", INTERPRET)
        else:
            g = _dot(a, c, g, DOT, INTERPRET)
    return g


@triton.jit
def _halves(x, ROWS: tl.constexpr, HALF: tl.constexpr):
    """x's left and right column halves."""
    return tl.split(tl.permute(tl.reshape(x, (ROWS, 2, HALF)), (0, 2, 1)))


@triton.jit
def _column_slices(x, ROWS: tl.constexpr, COLS: tl.constexpr, SLICES: tl.constexpr):
    """x [ROWS, COLS] as SLICES (1, 2 or 4) column slices, left to right: the epilogue runs on one at a time."""
    slices = (x,)
    if SLICES == 2:
        slices = _halves(x, ROWS, COLS // 2)
    elif SLICES == 4:
        left, right = _halves(x, ROWS, COLS // 2)
        slices = _halves(left, ROWS, COLS // 4) + _halves(right, ROWS, COLS // 4)
    return slices


@triton.jit
def _clamped(g, clamp):
    """g clamped to [clamp - 1, 1 - clamp], NaN kept, as torch's clamp: a NaN hidden state gives a NaN loss."""
    c = tl.maximum(g, clamp - 1.0, propagate_nan=tl.PropagateNan.ALL)
    return tl.minimum(c, 1.0 - clamp, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _hinge(c, angle):
    """orthogonalization's relu(1/2 - D) = relu(arcsin(c)) / pi: exactly 0 for c <= 0, so that a zero
    vector's pairs (c = 0, the hinge's kink) give 0 as in torch, whatever the rounding of the root; NaN stays."""
    return tl.where(c <= 0, 0.0, (_HALF_PI - angle) * _INV_PI)


@triton.jit
def _pair_term(g, sq_sum, neg_inv_tau, clamp, VARIANT: tl.constexpr, ROWS: tl.constexpr):
    """The pair's term t(g), as dispersion.py's ``_pair_term_`` (logits for log-sum-exp variants);
    for raw rows (the spec's ``rows``) the distance logit -D / tau, D = sq_sum - 2 g.

    Products by constants, never divisions: Triton's fp32 division is approximate.
    """
    if VARIANT == "decorrelation":
        t = g * g
    elif ROWS == "raw":
        t = (sq_sum - 2.0 * g) * neg_inv_tau
    else:
        c = _clamped(g, clamp)
        angle = _arccos(c)
        if VARIANT == "angular_spread":
            t = angle * (_INV_PI * neg_inv_tau)
        else:
            h = _hinge(c, angle)
            t = h * h
    return t


@triton.jit
def _pair_weight(g, sq_sum, valid, m, log_s, neg_inv_tau, clamp, pair_scale, VARIANT: tl.constexpr,
                 ROWS: tl.constexpr):  # fmt: skip
    """W = dL/dg of the unordered pair where ``valid``, else 0; as dispersion.py's ``_pair_grad_``.

    pair_scale = 4 / pairs. Invalid logits are masked before exp: the diagonal and the
    padding of l2_repel have logits far above the maximum m, whose exp would overflow.
    The arccos slope 1 / (pi sqrt(1 - c^2)) is an approximate reciprocal root: the clamp keeps
    1 - c^2 >= clamp (2 - clamp).
    """
    if VARIANT == "decorrelation":
        w = g * pair_scale
    elif VARIANT == "l2_repel":
        t = tl.where(valid, _pair_term(g, sq_sum, neg_inv_tau, 0.0, VARIANT, ROWS), -float("inf"))
        w = tl.exp((t - m) - log_s) * (-4.0 * neg_inv_tau)
    else:
        c = _clamped(g, clamp)
        angle = _arccos(c)
        slope = tl.rsqrt(1.0 - c * c) * _INV_PI  # -dD/dc at the clamped c: straight-through
        if VARIANT == "angular_spread":
            w = tl.exp((angle * (_INV_PI * neg_inv_tau) - m) - log_s) * slope * (-2.0 * neg_inv_tau)
        else:
            w = _hinge(c, angle) * slope * pair_scale
    return tl.where(valid, w, 0.0)


@triton.jit
def _entropy_terms(p, eps):
    """perplexity_entropy's f(p) = p log2(p + eps) and p f'(p), 0 where p = 0, NaN where p is
    (variants.row_entropy_terms)."""
    log = tl.log2(p + eps)
    f = tl.where(p == 0, 0.0, p * log)
    pf = tl.where(p == 0, 0.0, p * (log + p / ((p + eps) * _LN2)))
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
    z_ptr, mean_ptr, u_ptr, stat_ptr, sq_ptr, tokens, n, d, row_stride, part_stride, guard, unit_eps,
    ROWS: tl.constexpr, STORE: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_ROWS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    """BLOCK_ROWS token rows: the stored rows u and two scalars each.

    unit / centred rows: u = x / stat, x = z (minus its feature mean if centred),
    stat = max(|x|, guard) + unit_eps (the released form's |z| + 1e-2 for unit rows);
    sq = |u|^2 of the stored u (for an exact projection).
    raw rows (l2_repel, perplexity_entropy): u = z - mean token of the sequence; stat = |z|^2 (the norm
    penalty); sq = |u|^2 of the stored u, so that D = sq_i + sq_j - 2 g is the distance
    of the stored rows themselves. STORE "split": u = hi + lo, both bf16, lo at part_stride.
    """
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    feats = tl.arange(0, BLOCK_D)
    inside = (row < tokens)[:, None] & (feats < d)[None, :]
    z = tl.load(z_ptr + row[:, None] * d + feats[None, :], mask=inside, other=0.0).to(tl.float32)
    if ROWS == "raw":
        x = z - tl.load(mean_ptr + (row // n)[:, None] * d + feats[None, :], mask=inside, other=0.0)
        stat = tl.sum(z * z, axis=1)
    else:
        x = z
        if ROWS == "centred":
            x = tl.where(inside, z - (tl.sum(z, axis=1) / d)[:, None], 0.0)
        scale = tl.max(tl.abs(x), axis=1)  # |x| = max|x| |x / max|x||: no squares overflow (variants.row_norm)
        scale = tl.where(scale > 0, scale, 1.0)
        unit = tl.div_rn(x, scale[:, None])
        stat = tl.maximum(scale * tl.sqrt_rn(tl.sum(unit * unit, axis=1)), guard, propagate_nan=tl.PropagateNan.ALL)
        stat += unit_eps  # an infinite entry's NaN norm kept: a NaN loss
        x = tl.div_rn(x, stat[:, None])
    out = u_ptr + row[:, None] * row_stride + feats[None, :]
    if STORE == "fp32":
        tl.store(out, x, mask=inside)
        u32 = x
    else:
        hi = _bf16(x, INTERPRET)
        tl.store(out, hi, mask=inside)
        u32 = hi.to(tl.float32)
        if STORE == "split":
            lo = _bf16(x - u32, INTERPRET)
            tl.store(out + part_stride, lo, mask=inside)
            u32 += lo.to(tl.float32)
    tl.store(stat_ptr + row, stat, mask=row < tokens)
    tl.store(sq_ptr + row, tl.sum(u32 * u32, axis=1), mask=row < tokens)


@triton.jit
def _forward_slice(g, rows, cols, sq_seq, n, neg_inv_tau, clamp, m, s, VARIANT: tl.constexpr, ROWS: tl.constexpr,
                  LOGSUMEXP: tl.constexpr):  # fmt: skip
    """(m, s) updated with one column slice's pairs i < j: running max and sum exp(t - max), or the sum of t."""
    t = _pair_term(g, _sq_sum(sq_seq, rows, cols, n, ROWS), neg_inv_tau, clamp, VARIANT, ROWS)
    valid = (rows[:, None] < cols[None, :]) & (cols[None, :] < n)
    if LOGSUMEXP:
        t = tl.where(valid, t, -float("inf"))
        m_new = tl.maximum(m, tl.max(tl.max(t, axis=1), axis=0))
        shift = tl.where(m_new == -float("inf"), 0.0, m_new)  # a tile without pairs sums to 0
        s = s * tl.exp(m - shift) + tl.sum(tl.sum(tl.exp(t - shift), axis=1), axis=0)
        m = m_new
    else:
        s += tl.sum(tl.sum(tl.where(valid, t, 0.0), axis=1), axis=0)
    return m, s


@triton.jit(do_not_specialize=PERSISTENT_BOUND)
def _pairs_forward_kernel(
    u_desc, sq_ptr, m_ptr, s_ptr, n, d, items, neg_inv_tau, clamp,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, LOGSUMEXP: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, SLICES: tl.constexpr,
):  # fmt: skip
    """Per upper-triangle tile pair (work item): (max, sum exp(t - max)) or the sum of t, at [item]."""
    SLICE: tl.constexpr = BLOCK // SLICES
    tiles = tl.cdiv(n, BLOCK)
    pairs = tiles * (tiles + 1) // 2
    for item in tl.range(tl.program_id(0), items, tl.num_programs(0), flatten=True):
        b, ti, tj = _work_item(item, pairs, tiles)
        rows = ti * BLOCK + tl.arange(0, BLOCK)
        sq_seq = sq_ptr + b.to(tl.int64) * n
        g = _column_slices(_gram_tile(u_desc, b, ti * BLOCK, tj * BLOCK, d, DOT, INTERPRET, BLOCK, BLOCK_K), BLOCK,
                           BLOCK, SLICES)  # fmt: skip
        m = -float("inf")
        s = 0.0
        for k in tl.static_range(SLICES):
            cols = tj * BLOCK + k * SLICE + tl.arange(0, SLICE)
            m, s = _forward_slice(g[k], rows, cols, sq_seq, n, neg_inv_tau, clamp, m, s, VARIANT, ROWS, LOGSUMEXP)
        tl.store(s_ptr + item, s)
        if LOGSUMEXP:
            tl.store(m_ptr + item, m)


@triton.jit
def _backward_slice(
    g, b, ti, tj, rows, c0, w_desc, wt_desc, r_ptr, sq_seq, stat_seq, m, log_s, m_r, ls_r, a_r, n, tiles,
    neg_inv_tau, clamp, pair_scale, entropy_eps,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, ROW_ENTROPY: tl.constexpr, SPLIT_WEIGHTS: tl.constexpr,
    INTERPRET: tl.constexpr, BLOCK: tl.constexpr, SLICE: tl.constexpr,
):  # fmt: skip
    """One column slice of a tile (columns c0 ...): W stored at (rows, cols) and (cols, rows), the columns' radial
    partials at slot ti; returns the rows' partials (sum_j W_ij g_ij, or sum_j W_ij for raw rows)."""
    cols = c0 + tl.arange(0, SLICE)
    in_c = cols < n
    valid = (rows[:, None] != cols[None, :]) & (rows[:, None] < n) & in_c[None, :]
    sq_sum = _sq_sum(sq_seq, rows, cols, n, ROWS)
    if ROW_ENTROPY:
        w = _entropy_weight(
            _pair_term(g, sq_sum, neg_inv_tau, 0.0, VARIANT, ROWS), valid, m_r, ls_r, a_r,
            tl.load(stat_seq + cols, mask=in_c, other=0.0), tl.load(stat_seq + n + cols, mask=in_c, other=0.0),
            tl.load(stat_seq + 2 * n + cols, mask=in_c, other=0.0), entropy_eps, pair_scale,
        )  # fmt: skip
    else:
        w = _pair_weight(g, sq_sum, valid, m, log_s, neg_inv_tau, clamp, pair_scale, VARIANT, ROWS)
    r0 = ti * BLOCK
    hi = _bf16(w, INTERPRET)
    w_desc.store([0, b, r0, c0], hi.reshape(1, 1, BLOCK, SLICE))
    stored = hi.to(tl.float32)  # the radial terms use W as stored, as W U will
    if SPLIT_WEIGHTS:
        lo = _bf16(w - stored, INTERPRET)
        w_desc.store([1, b, r0, c0], lo.reshape(1, 1, BLOCK, SLICE))
        stored += lo.to(tl.float32)
    radial = stored
    if ROWS != "raw":
        radial = stored * g
    if ti != tj:
        wt_desc.store([0, b, c0, r0], tl.trans(hi).reshape(1, 1, SLICE, BLOCK))
        if SPLIT_WEIGHTS:
            wt_desc.store([1, b, c0, r0], tl.trans(lo).reshape(1, 1, SLICE, BLOCK))
        tl.store(r_ptr + (b.to(tl.int64) * tiles + ti) * n + cols, tl.sum(radial, axis=0), mask=in_c)
    return tl.sum(radial, axis=1)


@triton.jit(do_not_specialize=PERSISTENT_BOUND)
def _pairs_backward_kernel(
    u_desc, w_desc, wt_desc, sq_ptr, m_ptr, log_s_ptr, stats_ptr, r_ptr, n, d, items, neg_inv_tau, clamp,
    pair_scale, entropy_eps,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, ROW_ENTROPY: tl.constexpr, LOGSUMEXP: tl.constexpr,
    DOT: tl.constexpr, SPLIT_WEIGHTS: tl.constexpr, INTERPRET: tl.constexpr, BLOCK: tl.constexpr,
    BLOCK_K: tl.constexpr, SLICES: tl.constexpr,
):  # fmt: skip
    """Per tile pair, recomputed: W into w[:, b] at (rows, cols) and (cols, rows), and the tile's
    radial partials r[b, tj, rows] and r[b, ti, cols].

    m, log_s: per sequence [B] for the log-sum-exp variants. stats: perplexity_entropy's per-token
    (m, log_s, a), [3, B, N], which ``_row_entropy_kernel`` summarised from its row softmaxes."""
    SLICE: tl.constexpr = BLOCK // SLICES
    tiles = tl.cdiv(n, BLOCK)
    pairs = tiles * (tiles + 1) // 2
    for item in tl.range(tl.program_id(0), items, tl.num_programs(0), flatten=True):
        b, ti, tj = _work_item(item, pairs, tiles)
        rows = ti * BLOCK + tl.arange(0, BLOCK)
        in_r = rows < n
        m = 0.0
        log_s = 0.0
        if LOGSUMEXP:
            m = tl.load(m_ptr + b)
            log_s = tl.load(log_s_ptr + b)
        stat_seq = stats_ptr + b.to(tl.int64) * 3 * n
        m_r = 0.0
        ls_r = 0.0
        a_r = 0.0
        if ROW_ENTROPY:
            m_r = tl.load(stat_seq + rows, mask=in_r, other=0.0)
            ls_r = tl.load(stat_seq + n + rows, mask=in_r, other=0.0)
            a_r = tl.load(stat_seq + 2 * n + rows, mask=in_r, other=0.0)
        sq_seq = sq_ptr + b.to(tl.int64) * n
        g = _column_slices(_gram_tile(u_desc, b, ti * BLOCK, tj * BLOCK, d, DOT, INTERPRET, BLOCK, BLOCK_K), BLOCK,
                           BLOCK, SLICES)  # fmt: skip
        r = tl.zeros((BLOCK,), dtype=tl.float32)
        for k in tl.static_range(SLICES):
            r += _backward_slice(g[k], b, ti, tj, rows, tj * BLOCK + k * SLICE, w_desc, wt_desc, r_ptr, sq_seq,
                                 stat_seq, m, log_s, m_r, ls_r, a_r, n, tiles, neg_inv_tau, clamp, pair_scale,
                                 entropy_eps, VARIANT, ROWS, ROW_ENTROPY, SPLIT_WEIGHTS, INTERPRET, BLOCK,
                                 SLICE)  # fmt: skip
        tl.store(r_ptr + (b.to(tl.int64) * tiles + tj) * n + rows, r, mask=in_r)


@triton.jit(do_not_specialize=PERSISTENT_BOUND)
def _pair_logits_kernel(
    u_desc, t_desc, tt_desc, sq_ptr, n, d, items, neg_inv_tau,
    VARIANT: tl.constexpr, ROWS: tl.constexpr, DOT: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, SLICES: tl.constexpr,
):  # fmt: skip
    """A row-entropy variant's forward (perplexity_entropy), per tile pair: the logits -D / tau
    (diagonal -inf) into t[0, b] at (rows, cols) and (cols, rows), for ``_row_entropy_kernel``."""
    SLICE: tl.constexpr = BLOCK // SLICES
    tiles = tl.cdiv(n, BLOCK)
    pairs = tiles * (tiles + 1) // 2
    # not flattened: Triton 3.6's loop fusion fails on this loop's conditional store (3.9 builds it)
    for item in tl.range(tl.program_id(0), items, tl.num_programs(0)):
        b, ti, tj = _work_item(item, pairs, tiles)
        r0 = ti * BLOCK
        rows = r0 + tl.arange(0, BLOCK)
        sq_seq = sq_ptr + b.to(tl.int64) * n
        g = _column_slices(_gram_tile(u_desc, b, r0, tj * BLOCK, d, DOT, INTERPRET, BLOCK, BLOCK_K), BLOCK, BLOCK,
                           SLICES)  # fmt: skip
        for k in tl.static_range(SLICES):
            c0 = tj * BLOCK + k * SLICE
            cols = c0 + tl.arange(0, SLICE)
            t = _pair_term(g[k], _sq_sum(sq_seq, rows, cols, n, ROWS), neg_inv_tau, 0.0, VARIANT, ROWS)
            t = tl.where(rows[:, None] == cols[None, :], -float("inf"), t)
            t_desc.store([0, b, r0, c0], t.reshape(1, 1, BLOCK, SLICE))
            if ti != tj:
                tt_desc.store([0, b, c0, r0], tl.trans(t).reshape(1, 1, SLICE, BLOCK))


@triton.jit
def _row_entropy_kernel(
    t_ptr, m_ptr, log_s_ptr, e_ptr, a_ptr, n, row_stride, entropy_eps, ROWS: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    """ROWS token rows of sequence b from their logits t: the row's softmax max m and log-sum log_s
    (one sweep, online), then (a second sweep) sum_j f(p_ij) and a_i = sum_j p_ij f'(p_ij).

    Two sweeps over the [ROWS, N] logits in memory, no products: the log2(p + eps) of the
    released form does not factor through a running sum, so p needs the finished row LSE."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    b = tl.program_id(1).to(tl.int64)
    ks = tl.arange(0, COLS)
    in_rows = rows < n
    row_ptrs = t_ptr + (b * n + rows[:, None]) * row_stride
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
def _radial_kernel(
    du_ptr, u_ptr, r_ptr, stat_ptr, sq_ptr, z_ptr, dz_ptr, grad_ptr, tokens, n, d, row_stride, part_stride, tiles,
    inv_batch, guard, unit_eps, norm_coeff,
    ROWS: tl.constexpr, U_PARTS: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    """dz of BLOCK_ROWS token rows from du = (W U)_i (cuBLAS) and each row's scalars.

    unit / centred rows, u = x / stat, stat = |x| + unit_eps: dz_i = s (du_i - u_i r_i
    |x_i| / (|u_i|^2 stat_i)) / stat_i (for unit_eps = 0 the projection on the stored u),
    the radial part dropped where |x_i| was clamped (for centred rows the centring's
    backward is a no-op: du and u are combinations of centred rows). raw rows:
    dz_i = s (du_i - u_i r_i + norm_coeff z_i). s = grad_out / B. u: the rows W U multiplied
    (hi + lo for U_PARTS 2), r: the sum of the row's TILES slots.
    """
    row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    feats = tl.arange(0, BLOCK_D)
    slots = tl.arange(0, TILES)
    in_row = row < tokens
    inside = in_row[:, None] & (feats < d)[None, :]
    r_slots = r_ptr + ((row // n) * tiles)[:, None] * n + slots[None, :] * n + (row % n)[:, None]
    r = tl.sum(tl.load(r_slots, mask=in_row[:, None] & (slots < tiles)[None, :], other=0.0), axis=1)[:, None]
    offsets = row[:, None] * d + feats[None, :]
    du = tl.load(du_ptr + offsets, mask=inside, other=0.0)
    u_rows = u_ptr + row[:, None] * row_stride + feats[None, :]
    u = tl.load(u_rows, mask=inside, other=0.0).to(tl.float32)
    if U_PARTS == 2:
        u += tl.load(u_rows + part_stride, mask=inside, other=0.0).to(tl.float32)
    stat = tl.load(stat_ptr + row, mask=in_row, other=1.0)[:, None]
    scale = tl.load(grad_ptr) * inv_batch
    if ROWS == "raw":
        z = tl.load(z_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
        dz = (du - u * r + norm_coeff * z) * scale
    else:
        norm = stat - unit_eps
        sq = tl.maximum(tl.load(sq_ptr + row, mask=in_row, other=1.0), 1e-30)[:, None]
        radial = tl.where(norm <= guard, 0.0, tl.div_rn(r * norm, sq * stat))
        dz = (du - u * radial) * tl.div_rn(scale, stat)
    tl.store(dz_ptr + offsets, dz.to(dz_ptr.dtype.element_ty), mask=inside)


# ----------------------------------------------------------------------------- host side


class _Rows(NamedTuple):
    """The stored rows of a batch, [parts, B, N, d] (a view of rows padded for TMA), and their
    per-token scalars (see ``_rows_kernel``)."""

    u: Tensor
    stat: Tensor
    sq: Tensor


def _padded(size: int) -> int:
    """A row length whose stride TMA accepts: a multiple of 16 bytes in bf16 and fp32."""
    return -(-size // 8) * 8


def _tma(t: Tensor, block: list[int]) -> TensorDescriptor:
    """A TMA descriptor of ``t`` (a view of a padded buffer) loading or storing ``block`` boxes."""
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block)


def _make_rows(layers: tuple[Tensor, ...], spec: VariantSpec, hp: PairHyper, plan: _Products) -> _Rows:
    """The rows of every layer's sequences, layer after layer: one launch per layer, read where it lies."""
    b, n, d = layers[0].shape
    device = layers[0].device
    dtype = torch.float32 if plan.rows == "fp32" else torch.bfloat16
    buf = torch.empty(2 if plan.rows == "split" else 1, len(layers) * b, n, _padded(d), device=device, dtype=dtype)
    stat = torch.empty(len(layers) * b, n, device=device)
    sq = torch.empty(len(layers) * b, n, device=device)
    for layer, z in enumerate(layers):
        seqs = slice(layer * b, (layer + 1) * b)
        mean = z.mean(dim=1, dtype=torch.float32) if spec.rows == "raw" else stat
        _rows_kernel[(triton.cdiv(b * n, ROWS_PER_PROGRAM),)](
            z, mean, buf[:, seqs], stat[seqs], sq[seqs], b * n, n, d, buf.stride(2), buf.stride(0), spec.guard(d),
            hp.unit_eps(spec), ROWS=spec.rows, STORE=plan.rows, INTERPRET=INTERPRETED, BLOCK_ROWS=ROWS_PER_PROGRAM,
            BLOCK_D=triton.next_power_of_2(d), num_warps=1 if INTERPRETED else 4,
        )  # fmt: skip
    return _Rows(buf[..., :d], stat, sq)


_JIT = {"forward": _pairs_forward_kernel, "backward": _pairs_backward_kernel, "logits": _pair_logits_kernel}
# Each pair kernel autotuned over PAIR_CONFIGS, per shape, variant and products: one variant's or
# precision's tuned configuration never serves another (its tiles stay the caller's).
_TUNED = {
    name: triton.autotune(
        configs=[triton.Config({}, num_warps=w, num_stages=st) for w, st in PAIR_CONFIGS],
        key=[k for k in ("n", "d", "VARIANT", "ROWS", "DOT", "SPLIT_WEIGHTS") if k in kernel.arg_names],
    )(kernel)
    for name, kernel in _JIT.items()
}

# _row_entropy_kernel's (ROWS, COLS, num_warps): no products, so one fixed shape; the
# interpreter's is small so that test sizes have partial row and column blocks.
ROW_ENTROPY_TILES = (16, 32, 1) if INTERPRETED else (16, 128, 8)


@dataclass(frozen=True)
class TritonTiles:
    """The exact loss in the fused kernels above; a ``PairKernel`` of dispersion.py.

    ``precision``: one of PRECISIONS (``dispersion_loss`` refuses others). ``tiles``: a fixed TileConfig
    instead of GPU_BLOCK tiles in GPU_SLICES, autotuned over PAIR_CONFIGS (under the interpreter,
    INTERPRETER_TILES unless given).
    ``max_weight_bytes`` bounds the backward's [sequences, N, N] weight buffer.
    """

    precision: str = "auto"
    tiles: TileConfig | None = None
    max_weight_bytes: int = MAX_WEIGHT_BYTES

    def loss(self, layers: list[Tensor], spec: VariantSpec, hp: PairHyper, lambda_norm: float) -> Tensor:
        _check_device(layers[0].device)
        return PairLoss.apply(spec, hp, lambda_norm, self, *(z.contiguous() for z in layers))

    def forward(
        self, layers: tuple[Tensor, ...], spec: VariantSpec, hp: PairHyper, lambda_norm: float
    ) -> tuple[Tensor, tuple[Tensor, ...]]:
        """Rows, then the triangle's partials (perplexity_entropy: its logits, then per-row sweeps): the per-sequence
        loss of the layers' sequences as one batch, each layer's rows read where it lies, and what backward needs:
        two scalars per sequence (perplexity_entropy: three per token)."""
        n, d = layers[0].shape[1:]
        plan = products(self.precision, spec)
        rows = _make_rows(layers, spec, hp, plan)
        per_seq, saved = (_row_entropy if spec.row_entropy else _pair_sums)(rows, spec, hp, self, plan)
        if spec.norm_penalty:
            per_seq = per_seq + rows.stat.sum(dim=1) * (lambda_norm / (n * d))
        return per_seq, saved

    def backward(
        self, layers: tuple[Tensor, ...], saved: tuple[Tensor, ...], grad_out: Tensor, spec: VariantSpec, hp: PairHyper,
        lambda_norm: float,
    ) -> tuple[Tensor, ...]:  # fmt: skip
        """Rows and triangle again, W once, dz = f(W U): each layer's gradient written where it lies."""
        plan = products(self.precision, spec)
        rows = _make_rows(layers, spec, hp, plan)
        dz = tuple(torch.empty_like(z) for z in layers)
        grad = grad_out.reshape(1).float()
        m, log_s = saved if spec.logsumexp else (rows.stat, rows.stat)  # placeholders where unread
        per_token = saved[0] if spec.row_entropy else rows.sq
        for b0, b1 in _sequence_groups(rows.sq.shape, 4 if plan.split_weights else 2, self.max_weight_bytes):
            _weights_and_dz(rows, (m[b0:b1], log_s[b0:b1], per_token[b0:b1]), layers, dz, grad, b0, b1, spec, hp,
                            lambda_norm, self, plan)  # fmt: skip
        return dz

    def config(self, plan: _Products) -> TileConfig:
        """The tiles of every kernel: the fixed ones, else GPU_BLOCK (IEEE_BLOCK for exact's CUDA-core
        products) in GPU_SLICES, a Gram step of STEP_BYTES of each stored part (half for CUDA cores),
        autotuned (num_warps 0)."""
        fixed = self.tiles or (INTERPRETER_TILES if INTERPRETED else None)
        if fixed:
            return fixed
        step = STEP_BYTES // 2 if plan.dot == "ieee" else STEP_BYTES
        block_k = step // (4 if plan.rows == "fp32" else 2 * 2 if plan.rows == "split" else 2)
        return TileConfig(IEEE_BLOCK if plan.dot == "ieee" else GPU_BLOCK, block_k, GPU_SLICES, 0)

    def launch(self, name: str, items: int, plan: _Products, spec: VariantSpec, device: torch.device, *args,
               **constexprs) -> None:  # fmt: skip
        """Launch pair kernel ``name`` over ``items`` tile pairs: a persistent grid of PROGRAMS_PER_SM
        programs per multiprocessor (one per item off the GPU), with fixed tiles or autotuned."""
        programs = items
        if device.type == "cuda":
            programs = min(items, PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)
        cfg = self.config(plan)
        constexprs |= {"VARIANT": spec.name, "ROWS": spec.rows, "DOT": plan.dot, "INTERPRET": INTERPRETED,
                       "BLOCK": cfg.block, "BLOCK_K": cfg.block_k, "SLICES": cfg.slices}  # fmt: skip
        if cfg.num_warps:
            _JIT[name][(programs,)](*args, **constexprs, num_warps=cfg.num_warps)
        else:
            _TUNED[name][(programs,)](*args, **constexprs)


def _pair_sums(rows: _Rows, spec: VariantSpec, hp: PairHyper, tiles: TritonTiles,
               plan: _Products) -> tuple[Tensor, tuple[Tensor, ...]]:  # fmt: skip
    """The per-sequence loss of the pair-sum variants from the triangle's partials, and what backward needs."""
    _, b, n, d = rows.u.shape
    block, block_k, _, _ = tiles.config(plan)
    items = b * math.comb(triton.cdiv(n, block) + 1, 2)  # the tile pairs ti <= tj of each sequence
    m_part = torch.empty(b, items // b, device=rows.u.device)
    s_part = torch.empty(b, items // b, device=rows.u.device)
    tiles.launch(
        "forward", items, plan, spec, rows.u.device, _tma(rows.u, [1, 1, block, block_k]), rows.sq, m_part, s_part,
        n, d, items, -1.0 / hp.tau, hp.clamp, LOGSUMEXP=spec.logsumexp,
    )  # fmt: skip
    if not spec.logsumexp:
        return s_part.sum(dim=1) * (2.0 / hp.pairs), ()
    lse = OnlineLogSumExp(b, rows.u.device)
    lse.add_partials(m_part, s_part)
    per_seq, m, log_s = lse.finish(spec, hp, n)
    return per_seq, (m, log_s)


def _square_buffer(parts: int, count: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A [parts, count, N, N] view of a buffer whose rows are padded for TMA."""
    return torch.empty(parts, count, n, _padded(n), device=device, dtype=dtype)[..., :n]


def _row_entropy(rows: _Rows, spec: VariantSpec, hp: PairHyper, tiles: TritonTiles,
                 plan: _Products) -> tuple[Tensor, tuple[Tensor]]:  # fmt: skip
    """perplexity_entropy's per-sequence loss, the mean of its per-token sum_j f(p_ij), and what backward
    needs, its per-token (m, log_s, a_i) [B, 3, N]: the triangle's logits into a [sequences, N, N] fp32
    buffer (in groups within max_weight_bytes), then the row sweeps."""
    _, b, n, d = rows.u.shape
    device = rows.u.device
    block, block_k, slices, _ = tiles.config(plan)
    cut = block // slices
    block_rows, cols, warps = ROW_ENTROPY_TILES
    stats = tuple(torch.empty(b, n, device=device) for _ in range(4))
    for b0, b1 in _sequence_groups(rows.sq.shape, 4, tiles.max_weight_bytes):
        logits = _square_buffer(1, b1 - b0, n, torch.float32, device)
        items = (b1 - b0) * math.comb(triton.cdiv(n, block) + 1, 2)
        tiles.launch(
            "logits", items, plan, spec, device, _tma(rows.u[:, b0:b1], [1, 1, block, block_k]),
            _tma(logits, [1, 1, block, cut]), _tma(logits, [1, 1, cut, block]), rows.sq[b0:b1], n, d, items,
            -1.0 / hp.tau,
        )  # fmt: skip
        _row_entropy_kernel[(triton.cdiv(n, block_rows), b1 - b0)](
            logits, *(s[b0:b1] for s in stats), n, logits.stride(2), hp.eps, ROWS=block_rows, COLS=cols,
            num_warps=warps,
        )  # fmt: skip
    m, log_s, entropy, a = stats
    return entropy.mean(dim=1), (torch.stack([m, log_s, a], dim=1),)


def _product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b of bf16 batches in fp32 products and an fp32 result: cuBLAS on a GPU (torch.bmm's
    out_dtype), the same values from fp32 copies elsewhere."""
    if a.is_cuda:
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.bmm(a.float(), b.float())


def _weights_times_rows(w: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """du = W U in fp32 [B, N, d] from bf16 products, and the rows it multiplied, [parts, B, N, d] in bf16:
    as stored (bf16, or hi and lo), their hi part for a W of one part, fp32 rows split into hi and lo for a
    W of two (the same rows as the radial term). For W and U in hi and lo parts, every product of parts,
    small first: (W_hi + W_lo)(U_hi + U_lo) to fp32's accumulation, so that du - u r cancels as exactly as
    the radial term r, which sees the same W and u."""
    if u.dtype == torch.float32:
        hi = u[0].bfloat16()
        u = torch.stack([hi, (u[0] - hi.float()).bfloat16()])
    else:
        u = u[: len(w)]
    du = None
    for i, j in ((1, 1), (1, 0), (0, 1), (0, 0)) if len(w) == 2 else ((0, 0),):
        du = _product(w[i], u[j]) if du is None else du.add_(_product(w[i], u[j]))
    return du, u


def _weights_and_dz(rows: _Rows, stats: tuple[Tensor, ...], layers: tuple[Tensor, ...], dz: tuple[Tensor, ...],
                    grad: Tensor, b0: int, b1: int, spec: VariantSpec, hp: PairHyper, lambda_norm: float,
                    tiles: TritonTiles, plan: _Products) -> None:  # fmt: skip
    """Sequences [b0, b1) of the layers' batch: W and the radial partials, then du = W U and each
    layer's dz (in place). ``stats``: the group's (m, log_s) per sequence (log-sum-exp variants) and
    perplexity_entropy's per-token (m, log_s, a) [group, 3, N]; placeholders where a variant reads none."""
    _, total, n, d = rows.u.shape
    count = b1 - b0
    block, block_k, slices, _ = tiles.config(plan)
    cut = block // slices
    tile_count = triton.cdiv(n, block)
    items = count * math.comb(tile_count + 1, 2)
    w = _square_buffer(2 if plan.split_weights else 1, count, n, torch.bfloat16, rows.u.device)
    radial = torch.empty(count, tile_count, n, device=rows.u.device)
    u = rows.u[:, b0:b1]
    pair_scale = 2.0 / (hp.tau * n) if spec.row_entropy else 4.0 / hp.pairs
    tiles.launch(
        "backward", items, plan, spec, rows.u.device, _tma(u, [1, 1, block, block_k]), _tma(w, [1, 1, block, cut]),
        _tma(w, [1, 1, cut, block]), rows.sq[b0:b1], *stats, radial, n, d, items, -1.0 / hp.tau, hp.clamp,
        pair_scale, hp.eps, ROW_ENTROPY=spec.row_entropy, LOGSUMEXP=spec.logsumexp, SPLIT_WEIGHTS=plan.split_weights,
    )  # fmt: skip
    du, u = _weights_times_rows(w, u)
    b = layers[0].shape[0]
    for layer, (z, dz_layer) in enumerate(zip(layers, dz, strict=True)):
        s0, s1 = max(b0, layer * b), min(b1, (layer + 1) * b)  # the group's sequences in this layer
        if s0 >= s1:
            continue
        here, there = slice(s0 - b0, s1 - b0), slice(s0 - layer * b, s1 - layer * b)
        _radial_kernel[(triton.cdiv((s1 - s0) * n, ROWS_PER_PROGRAM),)](
            du[here], u[:, here], radial[here], rows.stat[s0:s1], rows.sq[s0:s1], z[there], dz_layer[there], grad,
            (s1 - s0) * n, n, d, u.stride(2), u.stride(0), tile_count, 1.0 / total, spec.guard(d),
            hp.unit_eps(spec), 2.0 * lambda_norm * spec.norm_penalty / (n * d), ROWS=spec.rows, U_PARTS=len(u),
            BLOCK_ROWS=ROWS_PER_PROGRAM, BLOCK_D=triton.next_power_of_2(d), TILES=triton.next_power_of_2(tile_count),
            num_warps=1 if INTERPRETED else 4,
        )  # fmt: skip


def _sequence_groups(shape: torch.Size, element_bytes: int, max_bytes: int) -> list[tuple[int, int]]:
    """[b0, b1) groups of the [sequences, N] shape's sequences whose [group, N, N] buffer of ``element_bytes``
    fits ``max_bytes`` (at least one)."""
    b, n = shape
    per_group = max(1, max_bytes // (n * n * element_bytes))
    return [(b0, min(b0 + per_group, b)) for b0 in range(0, b, per_group)]


def _check_device(device: torch.device) -> None:
    """Refuse tensors the kernels cannot run on, saying how to run them."""
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton dispersion kernels need a CUDA tensor, got one on {device}; to run them on CPU, "
            "set TRITON_INTERPRET=1 before the process first uses them (or use kernel='torch')"
        )
