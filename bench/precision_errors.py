"""Each ``dispersion.precision`` of the Triton kernel against an fp64 reference: value and gradient.

Shapes: GPT-2 small's and Qwen3-1.7B's feature widths with shorter sequences; inputs random
(cosines near 0) or condensed (a shared direction plus 5% noise: cosines near 0.998, beyond
the clamp, as in a freshly initialised model's late blocks). Beside each precision, the
yardstick ``bf16 inputs``: the same reference on the hidden states rounded to bf16, which is
what bf16 training already does to the loss before any kernel runs.

Errors: |value - value64| / |value64|, and max |grad - grad64| / max |grad64|.

    python bench/precision_errors.py --device cuda
    TRITON_INTERPRET=1 python bench/precision_errors.py --device cpu --small   # slow: the interpreter
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dispersion_titan.losses import (  # noqa: E402
    PRECISIONS,
    VARIANTS,
    dispersion_loss,
    dispersion_loss_reference,
    precision_error,
)

SHAPES = {"gpt2_small": (2, 256, 768), "qwen3_1.7b": (1, 512, 2048)}
SMALL_SHAPES = {"gpt2_small": (1, 64, 192), "qwen3_1.7b": (1, 64, 256)}


def hidden_states(shape: tuple[int, int, int], inputs: str, device: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if inputs == "condensed":
        h = torch.randn(1, 1, shape[2], generator=gen, dtype=torch.float64) + 0.05 * h
    return h.to(device)


def value_and_grad(fn, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = hidden.detach().clone().requires_grad_()
    loss = fn(x)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach().double(), grad.double()


def gaps(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]) -> tuple[float, float]:
    value = ((got[0] - ref[0]).abs() / ref[0].abs()).item()
    grad = ((got[1] - ref[1]).abs().max() / ref[1].abs().max()).item()
    return value, grad


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="small shapes (for the interpreter)")
    args = p.parse_args()
    print(f"device={args.device} ({torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'})")
    print("| shape | inputs | variant | bf16 inputs (yardstick) | " + " | ".join(PRECISIONS) + " |")
    print("|---|---|---|---|" + "---|" * len(PRECISIONS))
    for shape_name, shape in (SMALL_SHAPES if args.small else SHAPES).items():
        for inputs in ("random", "condensed"):
            hidden = hidden_states(shape, inputs, args.device)
            for variant in VARIANTS:
                ref = value_and_grad(lambda x: dispersion_loss_reference(x, variant), hidden)
                yardstick = gaps(value_and_grad(lambda x: dispersion_loss_reference(x, variant),
                                                hidden.bfloat16().double()), ref)  # fmt: skip
                cells = [f"{yardstick[0]:.1e} / {yardstick[1]:.1e}"]
                for precision in PRECISIONS:
                    if precision_error(variant, precision):  # refused for this variant
                        cells.append("refused")
                        continue
                    got = value_and_grad(lambda x: dispersion_loss(x.float(), variant, kernel="triton",
                                                                   precision=precision), hidden)  # fmt: skip
                    value, grad = gaps(got, ref)
                    cells.append(f"{value:.1e} / {grad:.1e}")
                    print(f"RESULT precision.{shape_name}.{inputs}.{variant}.{precision}.value={value:.2g} "
                          f"precision.{shape_name}.{inputs}.{variant}.{precision}.grad={grad:.2g}")  # fmt: skip
                print(f"| {shape_name} {shape} | {inputs} | {variant} | " + " | ".join(cells) + " |", flush=True)
    print("cells: value / gradient relative error against fp64")


if __name__ == "__main__":
    main()
