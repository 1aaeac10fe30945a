"""End-to-end cost of the dispersion loss: training-step time of GPT-2 small at
seq_len 1024 with ``angular_spread`` on every block, against cross-entropy only.

Both objectives run in one process on the same model, optimizer and batch, steps
interleaved (CE, dispersion, CE, ...) so machine noise hits both alike; the ratio of
medians is reported. Target: ≤ 1.10×.

    python bench/train_step.py                      # small, seq_len 1024, batch 1 (CPU)
    python bench/train_step.py --device cuda --batch-size 8 --dtype bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.config.schema import Dispersion  # noqa: E402
from dispersion_titan.models.gpt2.args import gpt2_flavors  # noqa: E402
from dispersion_titan.models.gpt2.model import GPT2  # noqa: E402
from dispersion_titan.trainer.objective import DispersionObjective  # noqa: E402


def step_time(model, optimizer, tokens, labels, objective: DispersionObjective | None, dtype) -> float:
    device = tokens.device
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits, blocks = model(tokens, return_block_outputs=True)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        del logits
        if objective is not None:
            loss = loss + objective(blocks, step=1, with_stats=False).weighted
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flavor", default="small")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="measured steps per objective")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    model_args = gpt2_flavors[args.flavor]
    with torch.device("meta"):
        model = GPT2(model_args)
    model.to_empty(device=device)
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, model_args.vocab_size, (args.batch_size, args.seq_len + 1), device=device)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    cfg = Dispersion(variant="angular_spread", coeff=0.1, tau=1.0, layers="all")
    objective = DispersionObjective(cfg, model_args.n_layers, args.batch_size, seed=0, tp_group=None)

    times: dict[str, list[float]] = {"ce": [], "ce+angular_spread": []}
    for i in range(args.steps + 1):  # the first round warms up both paths
        for name, obj in (("ce", None), ("ce+angular_spread", objective)):
            t = step_time(model, optimizer, inputs, labels, obj, dtype)
            if i > 0:
                times[name].append(t)
    ce, disp = (statistics.median(times[k]) for k in times)
    print(f"device={device} dtype={args.dtype} flavor={args.flavor} batch={args.batch_size} "
          f"seq_len={args.seq_len} layers={model_args.n_layers} steps={args.steps} threads={torch.get_num_threads()}")
    print("| objective | median step s | ratio |")
    print("|---|---|---|")
    print(f"| ce | {ce:.3f} | 1.00 |")
    print(f"| ce + angular_spread (all {model_args.n_layers} blocks) | {disp:.3f} | {disp / ce:.3f} |")


if __name__ == "__main__":
    main()
