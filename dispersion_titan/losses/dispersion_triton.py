"""Fused Triton kernels for the dispersion losses: the pair matrix exists only tile by tile, in registers.

``TorchStrips`` (dispersion.py) materialises [B, rows, N] strips in global memory and
launches a few kernels per strip and elementwise step (about 300 per layer at GPT-2
small's N=1024), with its matmuls in fp32; on a GPU that is expected (not yet
measured) to cost far more than the matmuls themselves. Here, in the style of flash
attention:

- forward: one program per (row tile, column tile, sequence) of the upper triangle
  (column tile >= row tile; the diagonal tile masked to i < j). It forms the Gram tile
  of the rows with ``tl.dot``, applies the variant's elementwise function in registers
  and writes one partial result per tile: (max, sum of exp(t - max)) for the
  log-sum-exp variants, the sum of the terms otherwise, into a [B, tiles] buffer that
  torch combines; deterministic, no atomics.
- backward: one program per (row tile, feature chunk, sequence) loops over every
  column tile, recomputes the Gram tile, turns it into W = dL/dg (zero on the
  diagonal) and accumulates du_rows += W x_cols, using W's symmetry instead of
  scattering W^T x_rows into other programs' rows: again no atomics. Each program owns
  ``block_out`` features of du, so for d > block_out the Gram tiles are recomputed
  once per feature chunk (bounded registers instead of a [block, d] accumulator).

The rows (u = z / max(|z|, eps), centred rows for decorrelation, raw z for l2_repel)
and the backward through them are the O(B N d) torch code of dispersion.py, shared
with TorchStrips, as is the autograd Function; only the two pair passes live here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton import knobs

from dispersion_titan.losses.dispersion import _Hyper, _OnlineLogSumExp, _Variant

# Whether the @triton.jit kernels below were built for the interpreter (TRITON_INTERPRET=1
# when this module was first imported): then they run on CPU tensors too.
INTERPRETED = bool(knobs.runtime.interpret)

# Precision of the tile products (the Gram tiles and W x_cols), all with fp32
# accumulation: "bf16" rounds both factors to bf16 (one tensor-core product);
# "bf16x3", "tf32", "tf32x3" and "ieee" are Triton's input precisions for fp32 tiles
# (bf16x3: each value split into bf16 hi + lo, three products, about fp32 accuracy).
PRECISIONS = ("bf16", "bf16x3", "tf32", "tf32x3", "ieee")

_PI = tl.constexpr(math.pi)
_HALF_PI = tl.constexpr(math.pi / 2)


@triton.jit
def _arccos(x):
    """arccos(x) for x in [-1, 1] (Abramowitz & Stegun 4.4.46, reflected for x < 0).

    arccos(|x|) = sqrt(1 - |x|) * P7(|x|), |error| <= 2e-8 in exact arithmetic; in
    fp32 the max abs error against float64 arccos is below 5e-7 on [-1, 1]
    (tests/test_dispersion_kernel.py measures it on a dense grid). P7(0) is pi/2
    rounded like torch's arccos(0) (A&S: 1.5707963050), so a zero vector's pairs get
    D = 1/2 exactly, as in the torch paths: orthogonalization's hinge relu(1/2 - D)
    has its kink there, and the normalisation guard scales that row's gradient by 1e6.
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
    """x rounded to bf16 (to nearest even), kept as fp32; only for the interpreter, whose own bf16 casts
    round half up and drop the carry, and whose dot multiplies bf16 tiles as their uint16 storage."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """acc + a @ b for fp32 tiles a, b, with products in PRECISION and fp32 accumulation.

    Under the interpreter the bf16 precisions are emulated in fp32 with the same
    products: bf16 rounds both tiles; bf16x3 (Triton's split of each fp32 value into
    bf16 hi + lo) adds hi.lo and lo.hi to hi.hi. tf32 there is plain fp32.
    """
    if INTERPRET:
        if PRECISION == "bf16" or PRECISION == "bf16x3":
            a_hi = _bf16_in_fp32(a)
            b_hi = _bf16_in_fp32(b)
            acc = tl.dot(a_hi, b_hi, acc, input_precision="ieee")
            if PRECISION == "bf16x3":
                acc = tl.dot(a_hi, _bf16_in_fp32(b - b_hi), acc, input_precision="ieee")
                acc = tl.dot(_bf16_in_fp32(a - a_hi), b_hi, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc, input_precision="ieee")
    elif PRECISION == "bf16":
        acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _gram_tile(x_seq, rows, cols, n, d, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
               BLOCK: tl.constexpr, BLOCK_D: tl.constexpr):  # fmt: skip
    """g = x_rows . x_cols^T [BLOCK, BLOCK] of one sequence (x_seq: its first row); rows >= n give 0."""
    ks = tl.arange(0, BLOCK_D)
    a_ptrs = x_seq + rows[:, None] * d + ks[None, :]
    b_ptrs = x_seq + cols[None, :] * d + ks[:, None]  # x_cols^T, [BLOCK_D, BLOCK]
    g = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k0 in range(0, d, BLOCK_D):
        a = tl.load(a_ptrs + k0, mask=(rows[:, None] < n) & (ks[None, :] < d - k0), other=0.0)
        b = tl.load(b_ptrs + k0, mask=(cols[None, :] < n) & (ks[:, None] < d - k0), other=0.0)
        g = _dot(a, b, g, PRECISION, INTERPRET)
    return g


@triton.jit
def _angle(g, clamp):
    """(clamped c, pi * D = arccos of it) for the angular variants."""
    c = tl.minimum(tl.maximum(g, clamp - 1.0), 1.0 - clamp)
    return c, _arccos(c)


@triton.jit
def _pair_term(g, sq_sum, tau, clamp, VARIANT: tl.constexpr):
    """The pair's term t(g), as dispersion.py's ``_<variant>_term_`` (logits for log-sum-exp variants)."""
    if VARIANT == "decorrelation":
        t = g * g
    elif VARIANT == "l2_repel":
        t = -(sq_sum - 2.0 * g) / tau
    else:
        _, angle = _angle(g, clamp)
        if VARIANT == "angular_spread":
            t = -angle / (_PI * tau)
        else:
            h = tl.maximum(0.5 - angle / _PI, 0.0)
            t = h * h
    return t


@triton.jit
def _pair_weight(g, sq_sum, valid, m, log_s, tau, clamp, pair_scale, VARIANT: tl.constexpr):
    """W = dL/dg of the unordered pair where ``valid``, else 0; as dispersion.py's ``_<variant>_grad_``.

    pair_scale = 4 / pairs. Invalid logits are masked before exp: the diagonal and the
    padding of l2_repel have logits far above the maximum m, whose exp would overflow.
    """
    if VARIANT == "decorrelation":
        w = g * pair_scale
    elif VARIANT == "l2_repel":
        t = tl.where(valid, _pair_term(g, sq_sum, tau, clamp, VARIANT), -float("inf"))
        w = tl.exp((t - m) - log_s) * (4.0 / tau)
    else:
        c, angle = _angle(g, clamp)
        slope = 1.0 / (_PI * tl.sqrt(1.0 - c * c))  # -dD/dc at the clamped c: straight-through
        if VARIANT == "angular_spread":
            w = tl.exp((-angle / (_PI * tau) - m) - log_s) * slope * (2.0 / tau)
        else:
            w = tl.maximum(0.5 - angle / _PI, 0.0) * slope * pair_scale
    return tl.where(valid, w, 0.0)


@triton.jit
def _sq_sum(sq_seq, rows, cols, n, VARIANT: tl.constexpr):
    """|x_i|^2 + |x_j|^2 of the tile for l2_repel (sq_seq: the sequence's squared norms), else 0."""
    sq_sum = 0.0
    if VARIANT == "l2_repel":
        sq_rows = tl.load(sq_seq + rows, mask=rows < n, other=0.0)
        sq_cols = tl.load(sq_seq + cols, mask=cols < n, other=0.0)
        sq_sum = sq_rows[:, None] + sq_cols[None, :]
    return sq_sum


@triton.jit
def _forward_kernel(
    x_ptr, sq_ptr, m_ptr, s_ptr, n, d, tau, clamp,
    VARIANT: tl.constexpr, LOGSUMEXP: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One upper-triangle tile (ti, tj) of sequence b: (max, sum exp(t - max)) or the sum of t, at [b, ti, tj]."""
    ti = tl.program_id(0)
    tj = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    if tj >= ti:
        rows = ti * BLOCK + tl.arange(0, BLOCK)
        cols = tj * BLOCK + tl.arange(0, BLOCK)
        g = _gram_tile(x_ptr + b * n * d, rows, cols, n, d, PRECISION, INTERPRET, BLOCK, BLOCK_D)
        t = _pair_term(g, _sq_sum(sq_ptr + b * n, rows, cols, n, VARIANT), tau, clamp, VARIANT)
        valid = (rows[:, None] < cols[None, :]) & (cols[None, :] < n)
        out = (b * tl.num_programs(0) + ti) * tl.num_programs(1) + tj
        if LOGSUMEXP:
            t = tl.where(valid, t, -float("inf"))
            tile_max = tl.max(t)
            shift = tl.where(tile_max == -float("inf"), 0.0, tile_max)  # a tile without pairs sums to 0
            tl.store(m_ptr + out, tile_max)
            tl.store(s_ptr + out, tl.sum(tl.exp(t - shift)))
        else:
            tl.store(s_ptr + out, tl.sum(tl.where(valid, t, 0.0)))


@triton.jit
def _backward_kernel(
    x_ptr, sq_ptr, m_ptr, log_s_ptr, du_ptr, row_sums_ptr, n, d, tau, clamp, pair_scale,
    VARIANT: tl.constexpr, LOGSUMEXP: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_OUT: tl.constexpr,
):  # fmt: skip
    """du[b, rows, feats] = sum_{j != i} W_ij x_j over all column tiles (and sum_j W_ij for l2_repel)."""
    ti = tl.program_id(0)
    chunk = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    x_seq = x_ptr + b * n * d
    rows = ti * BLOCK + tl.arange(0, BLOCK)
    feats = chunk * BLOCK_OUT + tl.arange(0, BLOCK_OUT)
    in_feats = feats[None, :] < d
    m = 0.0
    log_s = 0.0
    if LOGSUMEXP:
        m = tl.load(m_ptr + b)
        log_s = tl.load(log_s_ptr + b)
    du = tl.zeros((BLOCK, BLOCK_OUT), dtype=tl.float32)
    row_sums = tl.zeros((BLOCK,), dtype=tl.float32)
    cols = tl.arange(0, BLOCK)
    for _ in range(0, tl.cdiv(n, BLOCK)):
        g = _gram_tile(x_seq, rows, cols, n, d, PRECISION, INTERPRET, BLOCK, BLOCK_D)
        valid = (rows[:, None] != cols[None, :]) & (rows[:, None] < n) & (cols[None, :] < n)
        sq_sum = _sq_sum(sq_ptr + b * n, rows, cols, n, VARIANT)
        w = _pair_weight(g, sq_sum, valid, m, log_s, tau, clamp, pair_scale, VARIANT)
        if VARIANT == "l2_repel":
            row_sums += tl.sum(w, axis=1)
        x_cols = tl.load(x_seq + cols[:, None] * d + feats[None, :], mask=(cols[:, None] < n) & in_feats, other=0.0)
        du = _dot(w, x_cols, du, PRECISION, INTERPRET)
        cols += BLOCK
    tl.store(du_ptr + b * n * d + rows[:, None] * d + feats[None, :], du, mask=(rows[:, None] < n) & in_feats)
    if VARIANT == "l2_repel":
        if chunk == 0:
            tl.store(row_sums_ptr + b * n + rows, row_sums, mask=rows < n)


@dataclass(frozen=True)
class TritonTiles:
    """The pair passes of dispersion.py's _PairLoss as fused Triton kernels.

    ``precision`` of the tile products: one of PRECISIONS, or "auto": bf16x3 for the
    cosine variants and ieee fp32 for l2_repel. Plain bf16 moves the gradients by a
    few 1e-3 relative (the Gram entries of unit vectors carry bf16's 2^-9 relative
    rounding); l2_repel works on raw z, where D = |z_i|^2 + |z_j|^2 - 2 z_i.z_j
    cancels, so any rounding of z_i.z_j at the scale of |z|^2 moves the logits -D/tau.

    Tile sizes (0: default): ``block`` x ``block`` pair tiles (GPU 64; interpreter 16,
    the smallest tl.dot tile), ``block_d`` features per Gram step (GPU 32) and
    ``block_out`` features of du per backward program (GPU min(128, d); the Gram tiles
    are recomputed once per feature chunk). Under the interpreter the feature blocks
    default to d rounded up to a power of two (at most 64): there every tl op costs
    about the same whatever its size. The GPU defaults are the largest that compile
    for sm_90 with (almost) no register spills at 8 warps; their speed is unmeasured.
    """

    precision: str = "auto"
    block: int = 0
    block_d: int = 0
    block_out: int = 0
    num_warps: int = 8

    def __post_init__(self) -> None:
        if self.precision != "auto" and self.precision not in PRECISIONS:
            raise ValueError(f"precision must be 'auto' or one of {PRECISIONS}, got {self.precision!r}")

    def launch_options(self, d: int, spec: _Variant) -> dict[str, object]:
        """The constexprs and launch options both kernels take, for rows of d features."""
        precision = self.precision
        if precision == "auto":
            precision = "ieee" if spec.rows == "raw" else "bf16x3"
        return dict(
            VARIANT=spec.name, LOGSUMEXP=spec.logsumexp, PRECISION=precision, INTERPRET=INTERPRETED,
            BLOCK=self.block or (16 if INTERPRETED else 64),
            BLOCK_D=self.block_d or _feature_block(d, 64 if INTERPRETED else 32),
            num_warps=self.num_warps,
        )  # fmt: skip

    def block_out_for(self, d: int) -> int:
        """Features of du per backward program."""
        return self.block_out or _feature_block(d, 64 if INTERPRETED else 128)

    def forward(self, x: Tensor, sq: Tensor | None, spec: _Variant, hp: _Hyper) -> _OnlineLogSumExp | Tensor:
        """Same contract as TorchStrips.forward."""
        _check_device(x.device)
        b, n, d = x.shape
        options = self.launch_options(d, spec)
        tiles = triton.cdiv(n, options["BLOCK"])
        m_part = torch.full((b, tiles * tiles), -math.inf, device=x.device)
        s_part = torch.zeros(b, tiles * tiles, device=x.device)
        _forward_kernel[(tiles, tiles, b)](
            x.contiguous(), _or(sq, s_part), m_part, s_part, n, d, hp.tau, hp.clamp, **options
        )
        if not spec.logsumexp:
            return s_part.sum(dim=1)
        lse = _OnlineLogSumExp(b, x.device)
        lse.add_partials(m_part, s_part)
        return lse

    def backward(
        self, x: Tensor, sq: Tensor | None, spec: _Variant, hp: _Hyper, lse: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor | None]:
        """Same contract as TorchStrips.backward."""
        _check_device(x.device)
        b, n, d = x.shape
        options = self.launch_options(d, spec)
        block_out = self.block_out_for(d)
        du = torch.empty(b, n, d, device=x.device)
        row_sums = torch.empty(b, n, device=x.device) if sq is not None else None
        m, log_s = lse if lse is not None else (du, du)
        grid = (triton.cdiv(n, options["BLOCK"]), triton.cdiv(d, block_out), b)
        _backward_kernel[grid](
            x.contiguous(), _or(sq, du), m, log_s, du, _or(row_sums, du), n, d, hp.tau, hp.clamp, 4.0 / hp.pairs,
            BLOCK_OUT=block_out, **options,
        )  # fmt: skip
        return du, row_sums


def _check_device(device: torch.device) -> None:
    """Refuse tensors the kernels cannot run on, saying how to run them."""
    if device.type != "cuda" and not INTERPRETED:
        raise ValueError(
            f"the Triton dispersion kernels need a CUDA tensor, got one on {device}; to run them on CPU, "
            "set TRITON_INTERPRET=1 before the process first uses them (or use kernel='torch')"
        )


def _or(tensor: Tensor | None, placeholder: Tensor) -> Tensor:
    """A pointer argument the kernel's variant never reads still needs some tensor."""
    return placeholder if tensor is None else tensor


def _feature_block(d: int, limit: int) -> int:
    """A power-of-two block of features: d rounded up, at most ``limit``, at least tl.dot's 16."""
    return max(16, min(triton.next_power_of_2(d), limit))
