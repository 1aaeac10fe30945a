"""bench/gpu_acceptance.sh's parsing: the benches' ``RESULT key=value`` lines and TorchTitan's
training log become one markdown table (tested on CPU with canned lines in
tests/test_dispersion_kernel.py).

    python bench/acceptance_table.py results RESULTS_FILE STEP_LOG...   # key=value lines from logs
    python bench/acceptance_table.py train TRAIN_LOG                    # the last logged step's figures
    python bench/acceptance_table.py table RESULTS_FILE TABLE_FILE FAILED
    python bench/acceptance_table.py numerics FAST_LOG EAGER_LOG FP32_LOG   # exit 1 outside the yardstick
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# TorchTitan's step line (rank 0), e.g.
# "step: 20  loss:  7.8125  grad_norm:  1.2  memory:  1.03GiB(1.08%)  tps: 12,345  tflops: 1.2  mfu: 0.12%"
_STEP = re.compile(r"step:\s*(\d+).*?loss:\s*([-\d.]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+)%")
# dispersion_titan's own per-step line: "step: 20  ce: 7.81  dispersion: -0.0123 ..."
_DISPERSION = re.compile(r"step:\s*(\d+)\s+ce:\s*([-\d.]+)\s+dispersion:\s*(-?[\d.]+)")


def result_lines(log_text: str) -> list[str]:
    """The ``key=value ...`` payloads of a bench's ``RESULT`` lines."""
    return [line[len("RESULT ") :].strip() for line in log_text.splitlines() if line.startswith("RESULT ")]


def train_lines(log_text: str) -> list[str]:
    """key=value payloads for the last logged training step: loss, memory, tokens/s per GPU, MFU, CE, dispersion."""
    out = []
    steps = _STEP.findall(log_text)
    if steps:
        step, loss, memory, tps, mfu = steps[-1]
        out.append(f"train.step={step} train.loss={loss} train.memory_gib={memory} "
                   f"train.tps_per_gpu={tps.replace(',', '')} train.mfu_pct={mfu}")  # fmt: skip
    terms = _DISPERSION.findall(log_text)
    if terms:
        _, ce, dispersion = terms[-1]
        out.append(f"train.ce={ce} train.dispersion={dispersion}")
    return out


def step_losses(log_text: str) -> dict[int, float]:
    """Each logged training step's loss (the last line of a step wins)."""
    return {int(step): float(loss) for step, loss, *_ in _STEP.findall(log_text)}


def numerics(fast: dict[int, float], eager: dict[int, float], fp32: dict[int, float]) -> tuple[list[str], bool]:
    """The fast path's per-step losses against the eager fp32-weight path's, beside what bf16 moves
    (eager bf16 against fp32 training): key=value lines, and whether |fast - eager| stays within."""
    steps = sorted(fast.keys() & eager.keys() & fp32.keys())
    if not steps:
        return ["numerics.steps=0"], False
    gap = max(abs(fast[s] - eager[s]) for s in steps)
    yardstick = max(abs(eager[s] - fp32[s]) for s in steps)
    within = gap <= yardstick
    return [
        f"numerics.steps={len(steps)} numerics.max_gap_fast_vs_eager={gap:.3g} numerics.max_gap_bf16_vs_fp32="
        f"{yardstick:.3g} numerics.within_yardstick={'yes' if within else 'no'}"
    ], within


def table(results_text: str, failed: bool) -> str:
    """One row per key=value item, in order, and whether every step passed."""
    rows = ["| quantity | value |", "|---|---|"]
    for line in results_text.splitlines():
        for item in line.split():
            key, _, value = item.partition("=")
            rows.append(f"| {key} | {value} |")
    rows.append(f"| all steps passed | {'no' if failed else 'yes'} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str]) -> None:
    command, *rest = argv
    if command == "results":
        for log in rest:
            print("\n".join(result_lines(Path(log).read_text(errors="replace"))))
    elif command == "train":
        print("\n".join(train_lines(Path(rest[0]).read_text(errors="replace"))))
    elif command == "numerics":
        lines, within = numerics(*(step_losses(Path(log).read_text(errors="replace")) for log in rest))
        print("\n".join(f"RESULT {line}" for line in lines))
        sys.exit(0 if within else 1)
    elif command == "table":
        results, table_file, failed = rest
        text = table(Path(results).read_text(), failed == "1")
        Path(table_file).write_text(text)
        print(text + f"(written to {table_file})")
    else:
        sys.exit(f"acceptance_table.py: unknown command {command!r}; see its docstring")


if __name__ == "__main__":
    main(sys.argv[1:])
