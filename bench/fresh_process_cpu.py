"""Benchmark: the CPU a fresh interpreter spends before it does anything, the floor under every test that starts
one (``launch/train.sh``'s check, a torchrun rank, a Slurm job): ``import torch``, ``import torchtitan.train``, and
``python -m dispersion_titan.train --check-only`` of the debug config. Each is run ``--repeats`` times in turn; the
CPU (user + system) is the child's, from ``getrusage``; the median is printed.

    python bench/fresh_process_cpu.py
    python bench/fresh_process_cpu.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "import torch": ["-c", "import torch"],
    "import torchtitan.train": ["-c", "import torchtitan.train"],
    "train --check-only (debug)": [
        "-m",
        "dispersion_titan.train",
        "--check-only",
        "--job.config_file",
        str(REPO / "train_configs" / "debug.toml"),
        "--checkpoint.no-enable",
    ],
}


def child_cpu(argv: list[str]) -> float:
    """CPU seconds (user + system) of one ``python ARGV`` run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISPERSION_TITAN_ALLOW_CPU": "1"}
    proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 10):  # 10: --check-only of a run already finished
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):  # interleaved: a machine's load falls on every command alike
        for name, argv in COMMANDS.items():
            cpu[name].append(child_cpu(argv))
    print("| process | CPU s (median) | min | max |\n|---|---|---|---|")
    for name, values in cpu.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")


if __name__ == "__main__":
    main()
