"""End-to-end cost of the dispersion loss: training-step time of GPT-2 small at
seq_len 1024 with a dispersion variant on every block, against cross-entropy only.

All objectives (CE, then each ``--variants`` × ``--precisions``) run in one process on
the same model, optimizer and batch, steps interleaved (CE, dispersion, CE, ...) so
machine noise hits all alike; the ratio of medians is reported. Target: ≤ 1.10×.

MFU counts the model's training FLOPs per token as the training loop does
(``GPT2ModelArgs.get_nparams_and_flops``: 6 per weight including the LM head, plus
attention; the dispersion loss's own FLOPs are not counted, so its cost shows as a
lower MFU) × tokens/s ÷ peak. The peak is ``--peak-tflops`` if given, else 989 dense
bf16 TFLOP/s (H100/H200 SXM) for bf16 on an H100/H200; otherwise no MFU is printed.
``--compile`` compiles each block as the trainer's ``--compile.enable`` does;
``--kernel`` and ``--precisions`` set ``dispersion.kernel`` and ``dispersion.precision``.
Besides the table it prints ``RESULT key=value`` lines for bench/gpu_acceptance.sh.

    python bench/train_step.py                      # small, seq_len 1024, batch 1 (CPU)
    python bench/train_step.py --device cuda --batch-size 8 --dtype bf16 --compile
    python bench/train_step.py --device cuda --dtype bf16 --compile --variants angular_spread l2_repel \
        --precisions auto exact
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torchtitan.config.job_config import Compile
from torchtitan.models.llama3.infra.parallelize import apply_compile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.config.schema import Dispersion  # noqa: E402
from dispersion_titan.losses import KERNELS, PRECISIONS, VARIANTS  # noqa: E402
from dispersion_titan.losses.variants import precision_error  # noqa: E402
from dispersion_titan.models.gpt2.args import gpt2_flavors  # noqa: E402
from dispersion_titan.models.gpt2.model import GPT2  # noqa: E402
from dispersion_titan.trainer.block_outputs import BlockOutputs  # noqa: E402
from dispersion_titan.trainer.objective import DispersionObjective  # noqa: E402

H100_BF16_PEAK = 989e12  # dense bf16 FLOP/s of an H100 SXM (an H200 has the same compute)


def step_time(model, blocks: BlockOutputs, optimizer, tokens, labels, objective: DispersionObjective | None,
              dtype, synchronize: bool = True) -> float:
    device = tokens.device
    if device.type == "cuda" and synchronize:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(tokens)
        outputs = blocks.take()  # the trainer's hooks: captured in every training forward
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        del logits
        if objective is not None:
            loss = loss + objective(outputs, step=1, with_stats=False, chunk=0).weighted
        del outputs
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda" and synchronize:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def implicit_syncs(model, blocks, optimizer, inputs, labels, objectives: dict, dtype) -> int:
    """Host syncs that torch.cuda's sync debug mode reports in one step of each objective (each printed)."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for obj in objectives.values():
                step_time(model, blocks, optimizer, inputs, labels, obj, dtype, synchronize=False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught
             if "synchroniz" in str(w.message).lower() and "debug mode is a prototype" not in str(w.message)]
    for w in syncs:
        print(f"implicit sync: {w.filename}:{w.lineno}: {str(w.message).splitlines()[0]}")
    return len(syncs)


def peak_flops(args: argparse.Namespace, device: torch.device) -> tuple[float, str] | None:
    """(peak FLOP/s, where it comes from) for the MFU, or None when there is no sound default."""
    if args.peak_tflops:
        return args.peak_tflops * 1e12, f"--peak-tflops {args.peak_tflops:g}"
    if device.type == "cuda" and args.dtype == "bf16":
        name = torch.cuda.get_device_name(device)
        if "H100" in name or "H200" in name:
            return H100_BF16_PEAK, f"{H100_BF16_PEAK / 1e12:.0f} TFLOP/s, dense bf16 of an H100 SXM ({name})"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per objective")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--compile", action="store_true", help="torch.compile each block, as --compile.enable does")
    parser.add_argument("--kernel", choices=KERNELS, default="auto", help="the dispersion loss's pair kernel")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["angular_spread"])
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["auto"])
    parser.add_argument("--sync-debug", action="store_true",
                        help="after timing, one more step of each objective under torch.cuda.set_sync_debug_mode('warn'): "
                             "prints the implicit host syncs it reports")  # fmt: skip
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="peak TFLOP/s for the MFU (default: see above)")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    model_args = gpt2_flavors[args.flavor]
    with torch.device("meta"):
        model = GPT2(model_args)
    model.to_empty(device=device)
    model.init_weights()
    _, flops_per_token = model_args.get_nparams_and_flops(model, args.seq_len)
    if args.compile:
        apply_compile(model, Compile(enable=True))
    blocks = BlockOutputs(model, "blocks")  # after compile, as the trainer registers them
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, model_args.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    objectives: dict[str, DispersionObjective | None] = {"ce": None}
    for variant in args.variants:
        for precision in (p for p in args.precisions if not precision_error(variant, p)):
            cfg = Dispersion(variant=variant, coeff=0.1, tau=1.0, layers="all", kernel=args.kernel,
                             precision=precision)  # fmt: skip
            key = f"ce_{variant}" + ("" if precision == "auto" else f"_{precision}")
            objectives[key] = DispersionObjective(cfg, model_args.n_layers, args.batch_size, seed=0, tp_group=None)
            objectives[key].check_kernel(device)

    times: dict[str, list[float]] = {name: [] for name in objectives}
    for i in range(args.steps + 1):  # the first round warms up every path (and compiles)
        for name, obj in objectives.items():
            t = step_time(model, blocks, optimizer, inputs, labels, obj, dtype)
            if i > 0:
                times[name].append(t)
    medians = {name: statistics.median(t) for name, t in times.items()}
    ce = medians["ce"]
    print(f"device={device} dtype={args.dtype} flavor={args.flavor} batch={args.batch_size} "
          f"seq_len={args.seq_len} layers={model_args.n_layers} steps={args.steps} compile={args.compile} "
          f"kernel={args.kernel} threads={torch.get_num_threads()}")  # fmt: skip
    peak = peak_flops(args, device)
    tokens_per_step = args.batch_size * args.seq_len
    print("| objective | median step s | ratio | tokens/s |" + (" MFU |" if peak else ""))
    print("|---|---|---|---|" + ("---|" if peak else ""))
    results = [f"RESULT train_step.flops_per_token={flops_per_token}"]
    for key, seconds in medians.items():
        label = "ce" if key == "ce" else key.replace("ce_", "ce + ", 1)
        rate = tokens_per_step / seconds
        mfu = f" {flops_per_token * rate / peak[0]:.3f} |" if peak else ""
        print(f"| {label} (all {model_args.n_layers} blocks) | {seconds:.4f} | {seconds / ce:.3f} | {rate:.0f} |{mfu}")
        results.append(f"RESULT train_step.{key}.s={seconds:.4g} train_step.{key}.ratio={seconds / ce:.3f} "
                       f"train_step.{key}.tokens_per_s={rate:.0f}")  # fmt: skip
        if peak:
            results[-1] += f" train_step.{key}.mfu={flops_per_token * rate / peak[0]:.3f}"
    print(f"MFU peak: {peak[1]}" if peak else "MFU: not printed (no --peak-tflops, and not bf16 on an H100/H200)")
    if args.sync_debug and device.type == "cuda":
        results.append(f"RESULT train_step.implicit_syncs={implicit_syncs(model, blocks, optimizer, inputs, labels, objectives, dtype)}")
    print("\n".join(results))


if __name__ == "__main__":
    main()
