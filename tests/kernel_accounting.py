"""Counts the work one forward+backward of the dispersion loss issues, on CPU.

Run under ``TRITON_INTERPRET=1`` (Triton's interpreter executes every program of every
launch in Python), it counts:

- matmul FLOPs: 2·M·N·K for every ``tl.dot`` where it executes (a split-precision product,
  bf16x3, counts its three tensor-core dots: the issued work), plus every torch
  matmul (mm, bmm, addmm, baddbmm); and the products behind them (a split product once);
- kernel launches;
- glue traffic: the elements read and written by every aten op outside the kernel
  launches, in fp32 units (a bf16 element counts one half). Allocations without data
  (``empty``) and the interpreter's own host copies around a launch are left out. On a CPU
  W U's bf16 operands are multiplied as fp32 copies (cuBLAS takes them as they are), which
  this counts: about 1.5·N/d + 1.5 more than a GPU moves.

Both in units of the loss's shape: B·N²·d FLOPs and B·N·d fp32 elements. The floor is
4·B·N²·d (the Gram triangle, its recompute, W U); ``tests/test_dispersion_kernel.py``
asserts at most 4.5 and 12, and ``bench/h100_model.py`` turns the counts into a predicted time.

    TRITON_INTERPRET=1 python tests/kernel_accounting.py --B 1 --N 250 --d 250
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_MATMULS = {"mm", "bmm", "addmm", "baddbmm"}
SPLIT_PRODUCTS = ("bf16x3",)  # pair products issued as three tensor-core dots
_NO_DATA = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "view", "_unsafe_view",
            "t", "transpose", "unsqueeze", "squeeze", "expand", "as_strided", "slice", "select", "alias", "reshape",
            "permute", "lift_fresh"}  # fmt: skip


class Counts:
    """Running totals: matmul FLOPs (Triton dots and torch matmuls) and glue traffic in fp32 elements."""

    def __init__(self) -> None:
        self.dot_flops = 0
        self.split_dot_flops = 0  # the part of dot_flops issued by split-precision products (3 dots each)
        self.launches = 0
        self.kernels: Counter[str] = Counter()  # launches per kernel
        self.split = False
        self.torch_flops = 0
        self.glue_elements = 0.0
        self.in_launch = False


class _GlueCounter(TorchDispatchMode):
    def __init__(self, counts: Counts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.counts.in_launch:
            return out
        name = func.overloadpacket.__name__
        if name in _MATMULS:
            a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
            self.counts.torch_flops += 2 * a.numel() * b.shape[-1]
        if name not in _NO_DATA:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.counts.glue_elements += sum(t.numel() * t.element_size() / 4 for t in tensors)
        return out


@contextlib.contextmanager
def counting() -> Iterator[Counts]:
    """Count Triton dots (interpreter only) and aten ops while the block runs."""
    from triton.runtime import interpreter

    counts = Counts()
    create_dot = interpreter.InterpreterBuilder.create_dot
    launch = interpreter.GridExecutor.__call__

    def counted_dot(self, a, b, d, *rest):
        m, k = a.data.shape[-2:]
        flops = 2 * m * k * b.data.shape[-1]
        counts.dot_flops += flops
        counts.split_dot_flops += flops if counts.split else 0
        return create_dot(self, a, b, d, *rest)

    def counted_launch(self, *args, **kwargs):
        counts.in_launch, counts.split = True, kwargs.get("DOT") in SPLIT_PRODUCTS
        counts.launches += 1
        counts.kernels[self.fn.__name__.strip("_")] += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            counts.in_launch = counts.split = False

    interpreter.InterpreterBuilder.create_dot = counted_dot
    interpreter.GridExecutor.__call__ = counted_launch
    try:
        with _GlueCounter(counts):
            yield counts
    finally:
        interpreter.InterpreterBuilder.create_dot = create_dot
        interpreter.GridExecutor.__call__ = launch


def account(variant: str, b: int, n: int, d: int, precision: str = "auto", tiles=None) -> dict[str, float]:
    """One forward+backward of the Triton kernel: its work in B·N²·d FLOPs and glue in B·N·d fp32 elements."""
    from dispersion_titan.losses import dispersion_loss
    from dispersion_titan.losses.dispersion_triton import INTERPRETED, TritonTiles

    assert INTERPRETED, "run with TRITON_INTERPRET=1"
    hidden = torch.randn(b, n, d, generator=torch.Generator().manual_seed(n)).requires_grad_()
    with counting() as counts:
        loss = dispersion_loss(hidden, variant, kernel=TritonTiles(precision, tiles))
        torch.autograd.grad(loss, hidden)
    square, rows = b * n * n * d, b * n * d
    return {
        "matmul_flops": (counts.dot_flops + counts.torch_flops) / square,
        "product_flops": (counts.dot_flops - counts.split_dot_flops * 2 / 3 + counts.torch_flops) / square,
        "launches": counts.launches,
        "triton_dot_flops": counts.dot_flops / square,
        "torch_matmul_flops": counts.torch_flops / square,
        "glue_traffic": counts.glue_elements / rows,
    }


def issued(b: int, n: int, d: int, block: int = 128, block_k: int = 64, glue: float = 2.0,
           pair_dots: int = 1) -> dict[str, float]:  # fmt: skip
    """The same counts from the launch geometry alone, for any shape (no interpreter): two passes over
    the T(T+1)/2 tile pairs of block x block (d padded to block_k), then W U (cuBLAS: unpadded).
    ``glue`` is the counted torch traffic (l2_repel's token mean, twice; ~0 for the others);
    ``pair_dots`` the tensor-core dots per pair product (3 for split-precision products)."""
    tiles = -(-n // block)
    pairs = 2 * (tiles * (tiles + 1) // 2) * 2 * block * block * (-(-d // block_k) * block_k)
    return {
        "matmul_flops": (pair_dots * pairs + 2 * n * n * d) / (n * n * d),
        "product_flops": (pairs + 2 * n * n * d) / (n * n * d),
        "glue_traffic": glue,
    }


def main() -> None:
    from dispersion_titan.losses import VARIANTS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--N", type=int, default=250)
    p.add_argument("--d", type=int, default=250)
    p.add_argument("--precision", default="auto")
    args = p.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({v: account(v, args.B, args.N, args.d, args.precision) for v in VARIANTS}, indent=1))


if __name__ == "__main__":
    main()
