"""The trainer's own step, timed: what ``launch/train.sh CONFIG`` runs, CE only against each
dispersion variant, side by side in one process.

It builds ``DispersionTrainer`` (TorchTitan's Trainer with our TrainSpec) from CONFIG as a
launch checks it (``job_config.parse.validated_args``: the same compile, optimizer, micro-
batches, mixed precision, loss and data path), then runs its ``train_step`` on the trainer's
own data, the variants interleaved (CE, variant 1, variant 2, CE, ...) so machine noise hits
all alike; only the trainer's dispersion objective is swapped between steps
(``DispersionTrainer.dispersion_objective``). One step is one optimizer step: the config's
global batch, in its micro-batches. Per variant it reports the median step, tokens/s, MFU,
peak memory and the step ratio against CE only. ``--autocast`` runs a sharding config on one GPU as
TorchTitan would without our one-rank FSDP2 (bf16 autocast over fp32 weights: the numerics before
issue 48), to compare with its bf16 parameters. ``--sdpa-backend`` pins the attention kernel
(cudnn, flash, efficient, math) for the whole run, as ``torch.nn.attention.sdpa_kernel`` does;
the default lets SDPA choose. TorchTitan's Qwen3 and Llama 3 attention sets its own list inside
each call, which overrides the pin when eager (a CPU runs them under any pin); compiled on a GPU,
Qwen3-0.6B's step changed with it (docs/benchmarks.md), for a reason not yet profiled.

MFU is TorchTitan's own: ``metrics_processor.num_flops_per_token`` × tokens/s ÷
``metrics_processor.gpu_peak_flops``, the numbers its ``mfu`` log line divides (the count is
checked against FlopCounterMode in tests/test_flops.py; the peak is TorchTitan's table for
the device, its A100 fallback on a CPU). The dispersion loss's own FLOPs are not counted, so
its cost shows as a lower MFU. Peak memory: the trainer's device-memory monitor, reset
before each step (on a CPU, the process's peak RSS, which never falls). Checkpoints,
validation and TensorBoard are off; the run folder is a temporary one. Any other argument is
the job config's (``--profile cpu``, ``--training.global_batch_size 8``, ...).

    python bench/train_step.py train_configs/gpt2_small_mlp3072.toml --variants angular_spread l2_repel
    python bench/train_step.py train_configs/debug.toml --steps 2 --warmup 1      # CPU, seconds
    python bench/train_step.py train_configs/gpt2_small_mlp3072.toml --profile cpu --training.global_batch_size 1

Besides the table it prints ``RESULT key=value`` lines for bench/gpu_acceptance.sh. A variant whose
objective (its kernel self-check) or step fails is marked failed in its row, and the others go on;
the exit status is then 1. CE only never depends on a variant: its failure ends the bench.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.config.cli import launch_args  # noqa: E402
from dispersion_titan.job_config.parse import setup_torchtitan, validated_args  # noqa: E402
from dispersion_titan.losses import PRECISIONS, VARIANTS  # noqa: E402
from dispersion_titan.losses.variants import precision_error  # noqa: E402
from dispersion_titan.train import default_to_single_process  # noqa: E402
from dispersion_titan.trainer.trainer import DispersionTrainer  # noqa: E402
from dispersion_titan.utils.errors import cause, command  # noqa: E402

SDPA_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
COLUMNS = ("objective", "step ms", "ratio", "tokens/s", "MFU", "peak GiB")
BENCH_ONLY = (
    "--checkpoint.no-enable",
    "--validation.no-enable",
    "--metrics.no-enable_tensorboard",
    "--metrics.no-enable_wandb",
    "--metrics.log_freq",
    "1000000",
)


def objective_configs(base, variants: list[str], precisions: list[str], coeff: float) -> dict[str, object]:
    """``[dispersion]`` sections by name: ``ce`` (no term), then each variant at each precision it takes."""
    configs = {"ce": dataclasses.replace(base, variant="none", coeff=0.0)}
    for variant in variants:
        for precision in (p for p in precisions if not precision_error(variant, p)):
            key = variant + ("" if precision == "auto" else f"_{precision}")
            configs[key] = dataclasses.replace(base, variant=variant, coeff=coeff, precision=precision)
    return configs


def sdpa_pin(backend: str) -> contextlib.AbstractContextManager:
    """The only attention kernel SDPA may use (``default``: SDPA's own choice)."""
    return contextlib.nullcontext() if backend == "default" else sdpa_kernel([SDPA_BACKENDS[backend]])


def timed_step(trainer: DispersionTrainer, data) -> tuple[float, float]:
    """(seconds, peak GiB) of one optimizer step, the device synchronized around it."""
    sync = torch.cuda.synchronize if trainer.device.type == "cuda" else (lambda: None)
    monitor = trainer.metrics_processor.device_memory_monitor
    monitor.reset_peak_stats()
    sync()
    start = time.perf_counter()
    trainer.step += 1
    trainer.train_step(data)
    sync()
    return time.perf_counter() - start, monitor.get_peak_stats().max_active_gib


def implicit_syncs(trainer: DispersionTrainer, data, objectives: dict) -> int:
    """Host syncs that torch.cuda's sync debug mode reports in one step of each objective (each printed)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for objective in objectives.values():
                trainer.dispersion = objective
                trainer.step += 1
                trainer.train_step(data)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [
        w
        for w in caught
        if "synchroniz" in str(w.message).lower() and "debug mode is a prototype" not in str(w.message)
    ]
    for w in syncs:
        print(f"implicit sync: {w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}")
    return len(syncs)


@contextlib.contextmanager
def bench_trainer(config: str, job_args: list[str]) -> Iterator[DispersionTrainer]:
    """``DispersionTrainer`` of ``config`` as a 1-process launch checks it, with checkpoints,
    validation and logging off and a temporary run folder; closed on exit."""
    default_to_single_process()
    setup_torchtitan()
    with tempfile.TemporaryDirectory(prefix="train_step_") as dump:
        args = launch_args(config, *job_args, *BENCH_ONLY, "--job.dump_folder", dump, "--training.steps", str(10**9))
        trainer = DispersionTrainer(validated_args(args, world_size=1))
        try:
            yield trainer
        finally:
            trainer.close()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()


def run(
    config: str,
    job_args: list[str],
    variants: list[str],
    precisions: list[str],
    coeff: float,
    steps: int,
    warmup: int,
    sync_debug: bool = False,
    name: str = "train_step",
    sdpa_backend: str = "default",
    autocast: bool = False,
) -> dict[str, dict]:
    """Per objective: median step seconds, tokens/s, MFU, peak GiB, ratio to CE, or why it failed; prints the table."""
    failed: dict[str, str] = {}
    if autocast:  # replicated parameters: TorchTitan's bf16 autocast over fp32 weights on one process
        job_args = [*job_args, "--parallelism.data_parallel_shard_degree", "1"]
    with sdpa_pin(sdpa_backend), bench_trainer(config, job_args) as trainer:  # compiled at the first step, pinned
        job_config = trainer.job_config
        objectives = {}
        for key, cfg in objective_configs(job_config.dispersion, variants, precisions, coeff).items():
            try:
                objectives[key] = trainer.dispersion_objective(cfg)
            except Exception as err:  # a variant's kernel self-check: its row fails, the rest go on
                if key == "ce":
                    raise
                failed[key] = f"{type(err).__name__}: {cause(err)}"
        data = trainer.batch_generator(trainer.dataloader)
        times: dict[str, list[float]] = {key: [] for key in objectives}
        peaks: dict[str, float] = dict.fromkeys(objectives, 0.0)
        for round_ in range(warmup + steps):  # the warm-up rounds compile every path
            for key, objective in objectives.items():
                if key in failed:
                    continue
                trainer.dispersion = objective
                try:
                    seconds, peak = timed_step(trainer, data)
                except Exception as err:
                    if key == "ce":
                        raise
                    failed[key] = f"{type(err).__name__}: {cause(err)}"
                    continue
                if round_ >= warmup:
                    times[key].append(seconds)
                    peaks[key] = max(peaks[key], peak)
        working = {key: objective for key, objective in objectives.items() if key not in failed}
        syncs = implicit_syncs(trainer, data, working) if sync_debug and trainer.device.type == "cuda" else None
        metrics = trainer.metrics_processor
        flops_per_token, peak_flops = metrics.num_flops_per_token, metrics.gpu_peak_flops
        device = metrics.device_memory_monitor.device_name
        steps_run = trainer.step
        numerics = "autocast" if isinstance(trainer.maybe_enable_amp, torch.autocast) else "parameters"
    t = job_config.training
    tokens = t.global_batch_size * t.seq_len
    ce = statistics.median(times["ce"])
    results: dict[str, dict] = {}
    for key in [*times, *(k for k in failed if k not in times)]:
        if key in failed:
            results[key] = {"failed": failed[key]}
            continue
        median = statistics.median(times[key])
        rate = tokens / median
        results[key] = {
            "step_ms": median * 1e3,
            "ratio": median / ce,
            "tokens_per_s": rate,
            "mfu": flops_per_token * rate / peak_flops,
            "peak_gib": peaks[key],
            "steps": len(times[key]),
        }
    print(
        f"config={config} device={device} model={job_config.model.name}:{job_config.model.flavor} "
        f"global_batch={t.global_batch_size} micro_batch={t.local_batch_size} seq_len={t.seq_len} "
        f"compile={job_config.compile.enable} optimizer={job_config.optimizer.implementation} "
        f"mixed_precision={job_config.training.mixed_precision_param} ({numerics}) steps={steps} warmup={warmup} "
        f"threads={torch.get_num_threads()} sdpa_backend={sdpa_backend} head_loss={t.head_loss} "
        f"whole_model={job_config.compile.whole_model}"
    )
    print(f"trainer steps run: {steps_run}")
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for key, r in results.items():
        if "failed" in r:
            print(f"| {key} | failed: {r['failed']} |" + " |" * (len(COLUMNS) - 2))
            continue
        print(
            f"| {key} | {r['step_ms']:.1f} | {r['ratio']:.3f} | {r['tokens_per_s']:.0f} | {r['mfu']:.1%} | "
            f"{r['peak_gib']:.2f} |"
        )
    print(
        f"MFU: {flops_per_token / 1e9:.4g} GFLOP a token (the model's get_nparams_and_flops) over "
        f"{peak_flops / 1e12:.0f} TFLOP/s (TorchTitan's peak for {device})"
    )
    lines = [f"RESULT train_step.{name}.flops_per_token={flops_per_token}"]
    lines += ["RESULT " + (f"train_step.{name}.{key}.failed=1" if "failed" in r else
                           " ".join(f"train_step.{name}.{key}.{k}={v:.4g}" for k, v in r.items()))
              for key, r in results.items()]  # fmt: skip
    if syncs is not None:
        lines.append(f"RESULT train_step.{name}.implicit_syncs={syncs}")
    print("\n".join(lines))
    return results


@command("nothing was measured; rerun")  # a bad config or override: one line, as a launch says it
def main(argv: list[str] | None = None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a training config, e.g. train_configs/gpt2_small_mlp3072.toml")
    parser.add_argument(
        "--variants",
        nargs="*",
        choices=VARIANTS,
        default=["angular_spread"],
        help="dispersion variants timed against CE only (default: angular_spread)",
    )
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["auto"])
    parser.add_argument("--coeff", type=float, default=0.1, help="λ of every variant (default 0.1)")
    parser.add_argument("--steps", type=int, default=5, help="measured optimizer steps per objective")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first (compile, allocator)")
    parser.add_argument("--name", help="the RESULT lines' label (default: the config file's stem)")
    parser.add_argument("--sdpa-backend", choices=["default", *SDPA_BACKENDS], default="default",
                        help="the only attention kernel SDPA may use (default: SDPA's own choice)")  # fmt: skip
    parser.add_argument("--autocast", action="store_true",
                        help="a sharding config on one process under TorchTitan's bf16 autocast over fp32 weights "
                             "(data_parallel_shard_degree 1), not FSDP2's bf16 parameters")  # fmt: skip
    parser.add_argument("--sync-debug", action="store_true",
                        help="on CUDA, one more step of each objective under torch.cuda.set_sync_debug_mode('warn'): "
                             "prints the implicit host syncs it reports")  # fmt: skip
    args, job_args = parser.parse_known_args(argv)
    return run(
        args.config,
        job_args,
        args.variants,
        args.precisions,
        args.coeff,
        args.steps,
        args.warmup,
        args.sync_debug,
        args.name or Path(args.config).stem,
        args.sdpa_backend,
        args.autocast,
    )


if __name__ == "__main__":
    sys.exit(1 if any("failed" in r for r in main().values()) else 0)
