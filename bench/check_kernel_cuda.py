"""Correctness of the Triton dispersion kernels on CUDA, against ``dispersion_loss_reference``.

Runs the cases of tests/test_dispersion_kernel.py (which CI runs under Triton's CPU
interpreter, with tiny tiles) on the GPU with the default tile sizes, plus GPT-2
small's shape (B=2, N=1024, d=768) for every variant with fp32 and bf16 inputs and
at every precision (auto, bf16, tf32, exact), against the same tolerances; then every variant
at precision auto on condensed inputs (cosines above 0.9, as in deep layers) at that shape,
against the fp64 reference within twice the bf16 yardstick (tests' ``condensed_errors``).
Prints one table row per case, then ``RESULT key=value`` lines for bench/gpu_acceptance.sh;
exits 1 if any case is outside its tolerance.

    python bench/check_kernel_cuda.py
    python bench/check_kernel_cuda.py --quick   # GPT-2 small's shape, each variant at precision auto (as trained)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from test_dispersion_kernel import case_table, condensed_errors, run_case, tolerances, within_yardstick  # noqa: E402

from dispersion_titan.losses import PRECISIONS, VARIANTS  # noqa: E402
from dispersion_titan.losses.variants import precision_error  # noqa: E402
from dispersion_titan.utils.errors import cause  # noqa: E402

GPT2_SMALL = {"B": 2, "N": 1024, "d": 768, "tau": 1.0, "inputs": "gpt2_small"}
GPT2_SHAPE = (GPT2_SMALL["B"], GPT2_SMALL["N"], GPT2_SMALL["d"])
DEFAULT_TILES = {"tiles": None}  # autotuned


def cases(quick: bool = False) -> dict[str, dict]:
    """Every case, or with ``quick`` only GPT-2 small's shape at precision auto, fp32 and bf16 inputs."""
    table = {} if quick else {name: {**case, **DEFAULT_TILES} for name, case in case_table().items()}
    for variant in VARIANTS:
        for dtype in ("fp32", "bf16"):
            for precision in (p for p in (("auto",) if quick else PRECISIONS) if not precision_error(variant, p)):
                table[f"{variant}-gpt2_small-{dtype}-{precision}"] = {
                    "variant": variant, "dtype": dtype, "precision": precision, **GPT2_SMALL, **DEFAULT_TILES,
                }  # fmt: skip
    return table


def main() -> None:
    quick = "--quick" in sys.argv[1:]
    if not torch.cuda.is_available():
        sys.exit("check_kernel_cuda.py: CUDA is not available")
    failures = 0
    worst: dict[str, float] = {}
    print("| case | tiles | value rel | grad rel | tolerances | ok |")
    print("|---|---|---|---|---|---|")
    table = cases(quick)
    for name, case in table.items():
        try:
            got = run_case(case, device="cuda")
        except Exception as err:  # one case's failure is its row's; the others still run
            failures += 1
            print(f"| {name} | {case['precision']} | — | — | — | NO: {type(err).__name__}: {cause(err)} |", flush=True)
            continue
        value_tol, grad_tol = tolerances(case)
        ok = got["finite"] and got["value_rel"] <= value_tol and got["grad_rel"] <= grad_tol
        failures += not ok
        precision = case["precision"]
        for key in ("value_rel", "grad_rel"):
            worst[f"{precision}.{key}"] = max(worst.get(f"{precision}.{key}", 0.0), got[key])
        print(f"| {name} | {precision} | {got['value_rel']:.1e} | {got['grad_rel']:.1e} "
              f"| {value_tol:g}, {grad_tol:g} | {'yes' if ok else 'NO'} |", flush=True)  # fmt: skip
    for variant in VARIANTS:  # condensed: against the fp64 reference, within twice the bf16 yardstick
        name = f"{variant}-gpt2_small-condensed-auto"
        try:
            got = condensed_errors(variant, GPT2_SHAPE, device="cuda")
        except Exception as err:
            failures += 1
            print(f"| {name} | auto | — | — | — | NO: {type(err).__name__}: {cause(err)} |", flush=True)
            continue
        ok = within_yardstick(got)
        failures += not ok
        print(f"| {name} | auto | {got['value_rel']:.1e} | {got['grad_rel']:.1e} "
              f"| 2x yardstick {got['yardstick_value']:.1e}, {got['yardstick_grad']:.1e} | {'yes' if ok else 'NO'} |",
              flush=True)  # fmt: skip
        print(
            f"RESULT kernel_check.condensed.{variant}.grad_rel={got['grad_rel']:.2g} "
            f"kernel_check.condensed.{variant}.yardstick_grad={got['yardstick_grad']:.2g}"
        )
    print(f"RESULT kernel_check.cases={len(table) + len(VARIANTS)} kernel_check.failures={failures}")
    print("RESULT " + " ".join(f"kernel_check.worst.{key}={value:.2g}" for key, value in sorted(worst.items())))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
