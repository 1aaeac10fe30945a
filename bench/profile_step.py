"""Where a training step's time goes: a few of the trainer's own steps (bench/train_step.py's
trainer: CONFIG as a launch checks it) under ``torch.profiler``, each op's self time on the
device (CPU time on a CPU) summed into groups, and the top ops listed.

Groups, the first that matches an op's name or a range around it: dispersion (the trainer's
``dispersion_titan.dispersion`` range, the loss's autograd Functions and Triton kernels),
optimizer (``Optimizer.step``, AdamW's kernels, the gradient-norm clipping's foreach norms), loss
(log-softmax, NLL, cross-entropy), attention (SDPA, flash kernels), matmul (mm, addmm, bmm, GEMM kernels); the rest is
elementwise (norms, activations, casts, copies, inductor's fused pointwise kernels).

    python bench/profile_step.py train_configs/gpt2_small_mlp3072_angular_spread.toml
    python bench/profile_step.py train_configs/debug.toml --steps 1 --warmup 1 --dispersion.variant angular_spread \
        --dispersion.coeff 0.1                                   # CPU, seconds

Any other argument is the job config's (``--profile cpu``, ``--training.global_batch_size 8``, ...).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

from torch.profiler import ProfilerActivity, profile
from train_step import bench_trainer, timed_step

GROUPS = (
    (
        "dispersion",
        re.compile(r"dispersion|_PairLoss|_TritonPairLoss|_rows_kernel|_pairs_|_pair_logits|_row_entropy|_dz_kernel"),
    ),
    ("optimizer", re.compile(r"Optimizer\.|adam|multi_tensor_apply|_foreach_", re.IGNORECASE)),
    ("loss", re.compile(r"log_?softmax|nll_?loss|cross_?entropy|logsumexp", re.IGNORECASE)),
    ("attention", re.compile(r"attention|flash|sdpa|fmha", re.IGNORECASE)),
    ("matmul", re.compile(r"aten::(mm|addmm|bmm|matmul|linear)$|(Addmm|Bmm|Mm)Backward|gemm|xmma|nvjet|cutlass")),
)
ELEMENTWISE = "elementwise"


def group_of(event) -> str:
    """The first group whose pattern matches the op or a range it runs in."""
    names = []
    while event is not None:
        names.append(event.name)
        event = event.cpu_parent
    for group, pattern in GROUPS:
        if any(pattern.search(name) for name in names):
            return group
    return ELEMENTWISE


def grouped(prof, on_device: bool) -> tuple[dict[str, float], list[tuple[str, str, float]]]:
    """(seconds per group, [(op, group, seconds)] by op), from each event's self time."""
    groups: dict[str, float] = defaultdict(float)
    ops: dict[tuple[str, str], float] = defaultdict(float)
    for event in prof.events():
        seconds = (event.self_device_time_total if on_device else event.self_cpu_time_total) / 1e6
        if seconds <= 0:
            continue
        group = group_of(event)
        groups[group] += seconds
        ops[(event.name, group)] += seconds
    return dict(groups), sorted(((n, g, s) for (n, g), s in ops.items()), key=lambda row: -row[2])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config")
    parser.add_argument("--steps", type=int, default=3, help="profiled optimizer steps")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (compile, allocator)")
    parser.add_argument("--top", type=int, default=15, help="ops listed (default 15)")
    args, job_args = parser.parse_known_args(argv)
    with bench_trainer(args.config, job_args) as trainer:
        data = trainer.batch_generator(trainer.dataloader)
        for _ in range(args.warmup):
            timed_step(trainer, data)
        on_device = trainer.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
        with profile(activities=activities) as prof:
            for _ in range(args.steps):
                timed_step(trainer, data)
        device = trainer.metrics_processor.device_memory_monitor.device_name
        job = trainer.job_config
    groups, ops = grouped(prof, on_device)
    total = sum(groups.values())
    clock = "device" if on_device else "CPU"
    print(
        f"config={args.config} device={device} variant={job.dispersion.variant} "
        f"global_batch={job.training.global_batch_size} micro_batch={job.training.local_batch_size} "
        f"seq_len={job.training.seq_len} compile={job.compile.enable} steps={args.steps} ({clock} self time)"
    )
    print("| group | ms per step | share |\n|---|---|---|")
    for group in [g for g, _ in GROUPS] + [ELEMENTWISE]:
        seconds = groups.get(group, 0.0)
        print(f"| {group} | {seconds / args.steps * 1e3:.2f} | {seconds / total:.1%} |")
    print(f"\n| top op ({clock} self time) | group | ms per step | share |\n|---|---|---|---|")
    for name, group, seconds in ops[: args.top]:
        print(f"| `{name[:80]}` | {group} | {seconds / args.steps * 1e3:.2f} | {seconds / total:.1%} |")
    shares = {group: groups.get(group, 0.0) / total for group in [g for g, _ in GROUPS] + [ELEMENTWISE]}
    print("RESULT " + " ".join(f"profile_step.{group}.share={share:.3f} "
                               f"profile_step.{group}.ms_per_step={groups.get(group, 0.0) / args.steps * 1e3:.3g}"
                               for group, share in shares.items()))  # fmt: skip
    return shares


if __name__ == "__main__":
    main()
