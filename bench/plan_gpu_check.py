"""``dispersion-titan plan`` against a GPU: for a config on this one GPU, the plan's peak memory
per GPU and step time next to ``torch.cuda.max_memory_allocated`` and the measured step of the
same config (the trainer's own ``train_step``, as ``bench/train_step.py`` times it: compile,
fused AdamW and the config's micro-batches). The plan measures eager steps under
``FakeTensorMode`` and prices them by the roofline calibrated in
``dispersion_titan/planning/figures.py``; this says by how much each is off on this GPU.

    python bench/plan_gpu_check.py                                   # GPT-2 small (MLP 3072)
    python bench/plan_gpu_check.py train_configs/paper/midtrain_qwen3_0.6b_baseline.toml \\
        --model.hf_assets_path "" --training.dataset enwiki_sample   # random weights, nothing downloaded

Prints a table and ``RESULT plan_gpu.<config>.<key>=<value>`` lines for bench/gpu_acceptance.sh.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from train_step import bench_trainer, timed_step  # noqa: E402

from dispersion_titan.plan import plan_args  # noqa: E402
from dispersion_titan.planning.resource_plan import planned  # noqa: E402

GPU_NAMES = {"H100": "h100", "H200": "h200", "A100": "a100"}


def gpu_key() -> str:
    """The plan's GPU for this device (its name), h100 when it is none of the three."""
    name = torch.cuda.get_device_name()
    return next((key for word, key in GPU_NAMES.items() if word in name), "h100")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="?", default="train_configs/gpt2_small_mlp3072.toml")
    p.add_argument("--steps", type=int, default=5, help="measured optimizer steps (after 2 warm-up steps)")
    args, overrides = p.parse_known_args(argv)
    if not torch.cuda.is_available():
        sys.exit("plan_gpu_check.py: no CUDA device: nothing to check against")
    key, name = gpu_key(), Path(args.config).stem
    plan = planned(name, plan_args(args.config, None, tuple(overrides)), 1, None, key)
    with bench_trainer(args.config, overrides) as trainer:
        data = trainer.batch_generator(trainer.dataloader)
        for _ in range(2):  # compile, autotuning, the allocator's first sizes
            timed_step(trainer, data)
        torch.cuda.reset_peak_memory_stats()
        seconds = statistics.median(timed_step(trainer, data)[0] for _ in range(args.steps))
        peak = torch.cuda.max_memory_allocated()
    rows = {"peak_gb": (plan.step.peak / 1e9, peak / 1e9), "step_ms": (plan.time.step_s * 1e3, seconds * 1e3)}
    print(
        f"config={args.config} device={torch.cuda.get_device_name()} plan_gpu={key} "
        f"micro_batch={plan.layout.micro_batch} accumulation={plan.layout.accumulation}"
    )
    print("| quantity | planned | measured | planned / measured |\n|---|---|---|---|")
    for quantity, (planned_value, measured) in rows.items():
        print(f"| {quantity} | {planned_value:.3f} | {measured:.3f} | {planned_value / measured:.3f} |")
    print(f"step time: {plan.time.calibration.label}")
    print(
        "RESULT "
        + " ".join(
            f"plan_gpu.{name}.{quantity}.{which}={value:.4g}"
            for quantity, values in rows.items()
            for which, value in zip(("planned", "measured"), values, strict=True)
        )
    )


if __name__ == "__main__":
    main()
