"""Where a training step's time goes: the trainer's own steps (bench/train_step.py's trainer: CONFIG as a
launch checks it) under ``torch.profiler`` after warm-up, each unit of work counted once, summed into
groups, beside the measured step.

Counted once: on a GPU every device kernel, memcpy and memset, by its own duration, placed by the
op that launched it (a CPU op's device time is its kernels' and is not counted again); on a CPU every
op's self time (its CPU kernels), ranges (``record_function``) giving only their names. Groups, the
first that matches a kernel's name, its launching op or a range around it: dispersion (the trainer's
``dispersion_titan.dispersion`` range, the loss's autograd Functions and Triton kernels), optimizer
(``Optimizer.step``, AdamW's kernels, the gradient-norm clipping's foreach norms), loss (log-softmax,
NLL, cross-entropy, Liger's), attention (SDPA, flash, cuDNN kernels), matmul (mm, addmm, bmm, GEMM
kernels); the rest is elementwise (norms, activations, casts, copies, inductor's fused pointwise
kernels). ``idle`` is the measured step (the profiled steps' mean, device synchronised around each)
less everything counted: on a GPU the time the device waits; the groups and idle sum to the step.
Device work not attributed to a launching op is its own group, unattributed.

    python bench/profile_step.py train_configs/gpt2_small_mlp3072_angular_spread.toml
    python bench/profile_step.py train_configs/debug.toml --steps 2 --warmup 1 --dispersion.variant angular_spread \
        --dispersion.coeff 0.1                                   # CPU, seconds

Any other argument is the job config's (``--profile cpu``, ``--training.global_batch_size 8``, ...).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from train_step import SDPA_BACKENDS, bench_trainer, sdpa_pin, timed_step

GROUPS = (
    (
        "dispersion",
        re.compile(r"dispersion|PairLoss|_rows_kernel|_pairs_|_pair_logits|_row_entropy|_dz_kernel"),
    ),
    ("optimizer", re.compile(r"Optimizer\.|adam|multi_tensor_apply|_foreach_", re.IGNORECASE)),
    ("loss", re.compile(r"log_?softmax|nll_?loss|cross_?entropy|logsumexp|Liger", re.IGNORECASE)),
    ("attention", re.compile(r"attention|flash|sdpa|fmha", re.IGNORECASE)),
    ("matmul", re.compile(r"aten::(mm|addmm|bmm|matmul|linear)$|(Addmm|Bmm|Mm)Backward|gemm|xmma|nvjet|cutlass")),
)
ELEMENTWISE, UNATTRIBUTED, IDLE = "elementwise", "unattributed", "idle"
ROWS = (*(g for g, _ in GROUPS), ELEMENTWISE, UNATTRIBUTED, IDLE)


def group_of(names: Iterable[str]) -> str:
    """The first group whose pattern matches one of ``names`` (a kernel, its op, the ranges around it)."""
    names = list(names)
    for group, pattern in GROUPS:
        if any(pattern.search(name) for name in names):
            return group
    return ELEMENTWISE


def context(event) -> Iterator[str]:
    """The names of ``event`` and of every op and range it runs in, innermost first."""
    while event is not None:
        yield event.name
        event = event.cpu_parent


def counted(events, on_device: bool) -> Iterator[tuple[str, str, float]]:
    """(name, group, seconds) of each unit of work once: a device's kernels, or a CPU's ops' self time."""
    for event in events:
        if event.device_type != DeviceType.CPU or event.is_async:
            continue
        if on_device:
            names = list(context(event))
            for kernel in event.kernels:
                yield kernel.name, group_of([kernel.name, *names]), kernel.duration / 1e6
        elif not event.is_user_annotation and event.self_cpu_time_total > 0:
            yield event.name, group_of(context(event)), event.self_cpu_time_total / 1e6


def device_seconds(events) -> float:
    """The device's own events (kernels, copies), each once: what ``counted`` attributes, and the rest."""
    return sum(e.time_range.elapsed_us() for e in events if e.device_type != DeviceType.CPU) / 1e6


def table(events, on_device: bool, step_seconds: float, steps: int) -> tuple[dict[str, float], list[tuple]]:
    """(milliseconds per step by row of ROWS, [(kernel, group, ms per step, calls per step)] longest first)."""
    ms: dict[str, float] = defaultdict(float)
    kernels: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for name, group, seconds in counted(events, on_device):
        ms[group] += seconds * 1e3 / steps
        kernels[(name, group)][0] += seconds * 1e3 / steps
        kernels[(name, group)][1] += 1 / steps
    if on_device:
        ms[UNATTRIBUTED] = max(device_seconds(events) * 1e3 / steps - sum(ms.values()), 0.0)
    ms[IDLE] = step_seconds * 1e3 - sum(ms.values())
    rows = sorted(((n, g, t, c) for (n, g), (t, c) in kernels.items()), key=lambda row: -row[2])
    return {row: ms.get(row, 0.0) for row in ROWS}, rows


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=10, help="profiled optimizer steps (default 10)")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (compile, allocator)")
    parser.add_argument("--top", type=int, default=30, help="kernels listed (default 30)")
    parser.add_argument("--name", default="profile_step", help="the RESULT lines' label")
    parser.add_argument("--sdpa-backend", choices=["default", *SDPA_BACKENDS], default="default",
                        help="the only attention kernel SDPA may use (default: SDPA's own choice)")  # fmt: skip
    args, job_args = parser.parse_known_args(argv)
    with sdpa_pin(args.sdpa_backend), bench_trainer(args.config, job_args) as trainer:
        data = trainer.batch_generator(trainer.dataloader)
        for _ in range(args.warmup):
            timed_step(trainer, data)
        on_device = trainer.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
        with profile(activities=activities) as prof:
            step_seconds = sum(timed_step(trainer, data)[0] for _ in range(args.steps)) / args.steps
        device = trainer.metrics_processor.device_memory_monitor.device_name
        job = trainer.job_config
    events = prof.events()
    ms, kernels = table(events, on_device, step_seconds, args.steps)
    step_ms = step_seconds * 1e3
    work = "device kernels" if on_device else "CPU ops' self time"
    print(
        f"config={args.config} device={device} variant={job.dispersion.variant} "
        f"global_batch={job.training.global_batch_size} micro_batch={job.training.local_batch_size} "
        f"seq_len={job.training.seq_len} compile={job.compile.enable} head_loss={job.training.head_loss} "
        f"sdpa_backend={args.sdpa_backend} "
        f"steps={args.steps} warmup={args.warmup} ({work}, each once)"
    )
    print(f"measured step {step_ms:.2f} ms (mean of the profiled steps); counted work {step_ms - ms[IDLE]:.2f} ms")
    print("| group | ms per step | share of the step |\n|---|---|---|")
    for row in ROWS:
        print(f"| {row} | {ms[row]:.2f} | {ms[row] / step_ms:.1%} |")
    print(f"\n| top {args.top} ({work}) | group | ms per step | calls per step | share |\n|---|---|---|---|---|")
    for name, group, t, calls in kernels[: args.top]:
        print(f"| `{name[:90]}` | {group} | {t:.3f} | {calls:g} | {t / step_ms:.1%} |")
    figures = [f"{row}.ms_per_step={ms[row]:.4g}" for row in ROWS]
    figures += [f"step_ms={step_ms:.4g}", f"counted_over_step={1 - ms[IDLE] / step_ms:.3f}"]
    print("RESULT " + " ".join(f"{args.name}.{figure}" for figure in figures))
    return ms | {"step": step_ms}


if __name__ == "__main__":
    main()
