"""Benchmark: where the test suite's CPU goes, per test and per module. The suite is CPU-bound on its 2 cores, so
its wall time is its CPU over 2: any CPU-second cut from any test shortens it (docs/testing.md). A run with
``SUITE_CPU_LOG`` set logs each test's CPU in its worker, in the fresh processes it waited for, and in the jobs it
forked from the job server (``tests/conftest.py``, ``tests/support/jobs.py``); Slurm's jobs are not counted.

    SUITE_CPU_LOG=/tmp/suite_cpu.jsonl bash scripts/run_tests.sh
    python bench/suite_cpu.py /tmp/suite_cpu.jsonl --top 30
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

KINDS = ("worker", "processes", "job")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", help="the file SUITE_CPU_LOG named")
    parser.add_argument("--top", type=int, default=30, help="tests and modules listed (default: 30)")
    a = parser.parse_args()
    tests: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(KINDS, 0.0))
    with open(a.log) as f:
        for line in f:
            entry = json.loads(line)
            tests[entry["test"]][entry["kind"]] += entry["cpu"]
    total = {test: sum(kinds.values()) for test, kinds in tests.items()}
    modules: dict[str, float] = defaultdict(float)
    for test, seconds in total.items():
        modules[test.split("::")[0]] += seconds
    print(f"{sum(total.values()):,.0f} CPU-s in {len(tests)} tests ({', '.join(KINDS)}: " + ", ".join(
        f"{sum(kinds[k] for kinds in tests.values()):,.0f}" for k in KINDS) + ")")  # fmt: skip
    print(f"\n| CPU-s | {' | '.join(KINDS)} | test |\n|---:|" + "---:|" * len(KINDS) + "---|")
    for test in sorted(total, key=total.get, reverse=True)[: a.top]:
        print(f"| {total[test]:.1f} | " + " | ".join(f"{tests[test][k]:.1f}" for k in KINDS) + f" | {test} |")
    print("\n| CPU-s | module |\n|---:|---|")
    for module in sorted(modules, key=modules.get, reverse=True)[: a.top]:
        print(f"| {modules[module]:.0f} | {module} |")


if __name__ == "__main__":
    main()
