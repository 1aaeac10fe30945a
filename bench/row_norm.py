"""Benchmark: the cost of the loss's overflow-safe token norm (``losses.variants.row_norm``) against torch's
plain norm, which is infinite from |x| ~ 1.8e19 in fp32, and against the same scaled norm with its scale
differentiated (the form before the scale was made a constant to autograd).

Workload: u = x / (|x| + 1e-2) over [B, N, d], as the released form normalises each token, forward and
backward. The three forms are interleaved, median of ``--repeats`` after one warm-up each.

    python bench/row_norm.py                  # B=2 N=1024 d=768 on the CPU
    OMP_NUM_THREADS=1 python bench/row_norm.py --device cpu
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.losses.variants import row_norm  # noqa: E402


def plain(x: torch.Tensor) -> torch.Tensor:
    return x.norm(dim=-1, keepdim=True)


def scale_differentiated(x: torch.Tensor) -> torch.Tensor:
    scale = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(scale > 0, scale, 1.0)
    return (x / scale).norm(dim=-1, keepdim=True) * scale


FORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "plain norm (overflows)": plain,
    "row_norm": row_norm,
    "row_norm, scale differentiated": scale_differentiated,
}


def seconds(form: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    start = time.perf_counter()
    (x / (form(x) + 1e-2)).sum().backward()
    x.grad = None
    if x.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    x = torch.randn(a.B, a.N, a.d, device=a.device, requires_grad=True)
    times: dict[str, list[float]] = {name: [] for name in FORMS}
    for name, form in FORMS.items():
        seconds(form, x)  # warm-up
    for _ in range(a.repeats):
        for name, form in FORMS.items():
            times[name].append(seconds(form, x))
    base = statistics.median(times["plain norm (overflows)"])
    print(f"| form | ms (median of {a.repeats}) | vs plain |\n|---|---|---|")
    for name, measured in times.items():
        print(f"| {name} | {statistics.median(measured) * 1e3:.2f} | {statistics.median(measured) / base:.2f} |")
    print(f"B={a.B} N={a.N} d={a.d} device={a.device} threads={torch.get_num_threads()} torch={torch.__version__}")


if __name__ == "__main__":
    main()
