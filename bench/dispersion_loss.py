"""Benchmark: the dispersion loss's three paths, the fused Triton kernels, the lean
PyTorch strips and the naive ``dispersion_loss_reference``.

Workload: ``--layers`` independent hidden tensors [B, N, d] (one per hooked block),
loss = mean over layers, forward + backward. Per variant and implementation it
reports the median wall time (implementations interleaved, after one warm-up each),
the extra peak memory of one forward+backward, and the largest value/gradient gaps
to the naive version. ``triton`` runs only on CUDA (or on CPU under
TRITON_INTERPRET=1, far too slow for these sizes); elsewhere it is skipped with a note.

Extra peak memory is measured in a fresh subprocess per (implementation, variant):
inputs and their ``.grad`` buffers are allocated first, then one forward+backward
runs. On CPU (Linux) the figure is the process's peak RSS during that run minus
its RSS before it: the peak (``VmHWM``) is reset to the current RSS through
``/proc/self/clear_refs`` first. ``ru_maxrss`` is not used because a child
spawned by a large parent inherits the parent's RSS as its starting maximum. The
worker runs with ``MALLOC_MMAP_THRESHOLD_`` fixed at 1 MiB so glibc maps every
tensor-sized block separately and unmaps it on free; with the default adaptive
threshold, freed blocks stay in the heap and RSS measures allocator retention and
fragmentation (run to run) instead of live tensors. On CUDA it is
``max_memory_allocated`` minus the allocation after setup.

Besides the markdown table it prints ``RESULT key=value`` lines for
bench/gpu_acceptance.sh.

``--batched`` passes the layers to one call, as training does (the objective's chosen blocks as
one batch; the naive loss gets their concatenation). ``--baseline-kernel PATH`` adds the impl
``triton_baseline``: the ``dispersion_triton.py`` at PATH (an earlier commit's, e.g. ``git show
REV:dispersion_titan/losses/dispersion_triton.py > PATH``) at precision auto, timed beside ``triton``.

    python bench/dispersion_loss.py                 # B=8 N=1024 d=768, 12 layers
    python bench/dispersion_loss.py --device cuda --variants angular_spread
    python bench/dispersion_loss.py --impls naive lean --B 2 --N 512 --d 256 --layers 2
    python bench/dispersion_loss.py --device cuda --B 32 --dtype bf16 --batched --impls triton triton_baseline \
        --baseline-kernel baseline_kernel.py --no-memory

``floor_tflops`` in the RESULT lines: the exact loss's FLOP floor, 4·B·N²·d a layer
(``planning.figures.term_floor_flops``), over the measured time: the kernels' sustained rate.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.losses import VARIANTS, dispersion_loss, dispersion_loss_reference  # noqa: E402
from dispersion_titan.losses.variants import precision_error  # noqa: E402
from dispersion_titan.planning.figures import term_floor_flops  # noqa: E402

IMPL_PRECISIONS = {"triton_tf32": "tf32", "triton_exact": "exact"}
IMPLS: dict[str, Callable[..., torch.Tensor]] = {
    "naive": dispersion_loss_reference,
    "lean": partial(dispersion_loss, kernel="torch"),
    "triton": partial(dispersion_loss, kernel="triton"),  # precision "auto"
    **{impl: partial(dispersion_loss, kernel="triton", precision=p) for impl, p in IMPL_PRECISIONS.items()},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_hidden(args: argparse.Namespace) -> list[torch.Tensor]:
    """One random hidden tensor per layer, with preallocated zero ``.grad`` buffers.

    Preallocating ``.grad`` makes backward accumulate in place, so the measured extra
    memory is the loss's own working set rather than the gradient outputs.
    """
    gen = torch.Generator().manual_seed(args.seed)
    hidden = []
    for _ in range(args.layers):
        h = torch.randn(args.B, args.N, args.d, generator=gen)
        h = h.to(device=args.device, dtype=DTYPES[args.dtype]).requires_grad_()
        h.grad = torch.zeros_like(h)
        hidden.append(h)
    return hidden


class BaselineKernel:
    """An earlier commit's TritonTiles (loaded from a file) as a kernel object of today's
    dispersion_loss, which hands kernels a list of layers: its loss takes their concatenation."""

    def __init__(self, path: str) -> None:
        spec = importlib.util.spec_from_file_location("baseline_dispersion_triton", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        self.tiles = module.TritonTiles("auto")

    def loss(self, layers: list[torch.Tensor], *args) -> torch.Tensor:
        return self.tiles.loss(torch.cat(layers) if len(layers) > 1 else layers[0], *args)


def step(impl: str, variant: str, hidden: list[torch.Tensor], tau: float, batched: bool = False) -> torch.Tensor:
    """Forward + backward of the layer-mean loss; returns the per-layer losses (detached), or with
    ``batched`` the loss of all layers in one call (the naive loss on their concatenation)."""
    if batched:
        loss = IMPLS[impl](torch.cat(hidden) if impl == "naive" else hidden, variant, tau=tau)
        loss.backward()
        return loss.detach().reshape(1)
    per_layer = torch.stack([IMPLS[impl](h, variant, tau=tau) for h in hidden])
    per_layer.mean().backward()
    return per_layer.detach()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def memory_worker(args: argparse.Namespace) -> None:
    """Runs in a fresh process: print the extra peak bytes of one forward+backward."""
    impl, variant = args.memory_worker
    small = torch.randn(2, 8, 4, device=args.device, requires_grad=True)
    for name in args.impls:  # load kernels/thread pools before the baseline
        IMPLS[name](small, variant, tau=args.tau).backward()
    hidden = make_hidden(args)
    extra = extra_peak_bytes(lambda: step(impl, variant, hidden, args.tau, args.batched), args.device)
    print(json.dumps({"extra_bytes": extra}))


def extra_peak_bytes(run: Callable[[], object], device: str) -> int:
    """Peak memory growth while ``run()`` runs: allocator peak on CUDA, peak RSS on CPU."""
    if device.startswith("cuda"):
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        sync(device)
        return torch.cuda.max_memory_allocated() - base
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS watermark to the current RSS
    base = proc_status_bytes("VmRSS")
    run()
    return proc_status_bytes("VmHWM") - base


def proc_status_bytes(field: str) -> int:
    """A memory field of ``/proc/self/status`` (reported in kB) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not found in /proc/self/status")


def measure_memory(impl: str, variant: str, args: argparse.Namespace) -> float:
    """Extra peak memory in MiB, measured in a fresh subprocess."""
    cmd = [
        sys.executable, __file__, "--memory-worker", impl, variant,
        "--B", str(args.B), "--N", str(args.N), "--d", str(args.d),
        "--layers", str(args.layers), "--device", args.device, "--dtype", args.dtype,
        "--tau", str(args.tau), "--seed", str(args.seed), "--impls", *args.impls,
        *(["--batched"] if args.batched else []),
        *(["--baseline-kernel", args.baseline_kernel] if args.baseline_kernel else []),
    ]  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2**20)}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["extra_bytes"] / 2**20


def compare(variant: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Time the implementations interleaved; compare each one's values and gradients with the naive one's."""
    hidden = make_hidden(args)
    times: dict[str, list[float]] = {impl: [] for impl in args.impls}
    values: dict[str, torch.Tensor] = {}
    grads: dict[str, list[torch.Tensor]] = {}
    for rep in range(args.repeats + 1):  # repetition 0 is the warm-up
        for impl in args.impls:
            for h in hidden:
                h.grad.zero_()
            sync(args.device)
            start = time.perf_counter()
            values[impl] = step(impl, variant, hidden, args.tau, args.batched)
            sync(args.device)
            if rep > 0:
                times[impl].append(time.perf_counter() - start)
            grads[impl] = [h.grad.float().clone() for h in hidden]
    base = args.impls[0]
    value_scale = max(values[base].abs().max().item(), 1e-30)
    grad_scale = max(max(g.abs().max().item() for g in grads[base]), 1e-30)
    results = {}
    for impl in args.impls:
        value_diff = (values[impl] - values[base]).abs().max().item()
        grad_diff = max((a - b).abs().max().item() for a, b in zip(grads[impl], grads[base]))
        results[impl] = {
            "s": statistics.median(times[impl]),
            "value_diff": value_diff,
            "value_rel": value_diff / value_scale,
            "grad_diff": grad_diff,
            "grad_rel": grad_diff / grad_scale,
        }
    return results


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--N", type=int, default=1024)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="fp32", choices=DTYPES)
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--impls", nargs="+", default=["triton", "lean", "naive"], choices=[*IMPLS, "triton_baseline"],
                   help="implementations to run; the first is the baseline of the ratios and gaps")  # fmt: skip
    p.add_argument("--no-memory", action="store_true", help="skip the extra-memory subprocesses (time only)")
    p.add_argument("--batched", action="store_true", help="all layers in one call, as training passes them")
    p.add_argument("--baseline-kernel", metavar="PATH",
                   help="an earlier dispersion_triton.py, timed as impl triton_baseline")  # fmt: skip
    p.add_argument("--memory-worker", nargs=2, metavar=("IMPL", "VARIANT"), help=argparse.SUPPRESS)
    return p.parse_args()


def triton_runs_here(device: str) -> bool:
    """Whether kernel='triton' can run on ``device``: CUDA, or the interpreter, with triton importable."""
    if not (device.startswith("cuda") or os.environ.get("TRITON_INTERPRET") == "1"):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    args = parse_args()
    if "triton_baseline" in args.impls:
        if not args.baseline_kernel:
            sys.exit("dispersion_loss.py: --impls triton_baseline needs --baseline-kernel PATH")
        if not Path(args.baseline_kernel).is_file():
            sys.exit(f"dispersion_loss.py: --baseline-kernel {args.baseline_kernel}: no such file")
        if triton_runs_here(args.device):
            IMPLS["triton_baseline"] = partial(dispersion_loss, kernel=BaselineKernel(args.baseline_kernel))
    if args.memory_worker:
        memory_worker(args)
        return
    skipped = [impl for impl in args.impls if impl.startswith("triton")]
    if skipped and not triton_runs_here(args.device):
        print(
            f"note: skipping {', '.join(skipped)}: it needs CUDA (or TRITON_INTERPRET=1) and triton, "
            f"device={args.device}"
        )
        args.impls = [impl for impl in args.impls if impl not in skipped]
    print(
        f"device={args.device} dtype={args.dtype} B={args.B} N={args.N} d={args.d} "
        f"layers={args.layers} repeats={args.repeats} tau={args.tau} threads={torch.get_num_threads()}"
    )
    base = args.impls[0]
    header = (
        f"| variant | impl | s | time vs {base} | extra MiB | mem vs {base} "
        f"| max abs dvalue vs {base} (rel) | max abs dgrad vs {base} (rel) |"
    )
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    result_lines = []
    for variant in args.variants:
        # A precision the variant refuses (losses.variants.precision_error) is left out of its rows.
        runs = argparse.Namespace(
            **{
                **vars(args),
                "impls": [
                    impl for impl in args.impls if not precision_error(variant, IMPL_PRECISIONS.get(impl, "auto"))
                ],
            }
        )
        mem = {impl: float("nan") if args.no_memory else measure_memory(impl, variant, runs) for impl in runs.impls}
        results = compare(variant, runs)
        for impl, r in results.items():
            print(
                f"| {variant} | {impl} | {r['s']:.3f} | {r['s'] / results[base]['s']:.2f} "
                f"| {mem[impl]:.0f} | {mem[impl] / max(mem[base], 1e-9):.3f} "
                f"| {r['value_diff']:.1e} ({r['value_rel']:.1e}) | {r['grad_diff']:.1e} ({r['grad_rel']:.1e}) |",
                flush=True,
            )
            key = f"dispersion_loss.{variant}.{impl}"
            floor = term_floor_flops(args.B * args.layers, args.N, args.d) / r["s"] / 1e12
            result_lines.append(f"RESULT {key}.s={r['s']:.4g} {key}.floor_tflops={floor:.4g} "
                                f"{key}.extra_mib={mem[impl]:.0f} {key}.value_rel={r['value_rel']:.2g} "
                                f"{key}.grad_rel={r['grad_rel']:.2g}")  # fmt: skip
    print("\n".join(result_lines))


if __name__ == "__main__":
    main()
