"""bench/gpu_acceptance.sh's parsing: the benches' ``RESULT key=value`` lines and TorchTitan's
training log become one markdown table (tested on CPU with canned lines in
tests/test_dispersion_kernel.py).

    python bench/acceptance_table.py results RESULTS_FILE STEP_LOG...   # key=value lines from logs
    python bench/acceptance_table.py train TRAIN_LOG                    # the last logged step's figures
    python bench/acceptance_table.py table RESULTS_FILE TABLE_FILE FAILED
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
    return [line[len("RESULT "):].strip() for line in log_text.splitlines() if line.startswith("RESULT ")]


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
    elif command == "table":
        results, table_file, failed = rest
        text = table(Path(results).read_text(), failed == "1")
        Path(table_file).write_text(text)
        print(text + f"(written to {table_file})")
    else:
        sys.exit(f"acceptance_table.py: unknown command {command!r}; see its docstring")


if __name__ == "__main__":
    main(sys.argv[1:])
