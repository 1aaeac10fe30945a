"""``--steps``: ``all``, or a comma list of steps, inclusive ranges such as ``0,5,10-20``, and
``first`` / ``last`` (the run's earliest and latest checkpoints, known only once it has trained)."""

from __future__ import annotations

import re

from ..utils.errors import ArgumentError, CheckpointError
from .checkpoints import StepCheckpoint, find_checkpoint_folder, list_checkpoints, run_of

_RANGE = re.compile(r"^(\d+)-(\d+)$")


def select_steps(spec: str, available: list[StepCheckpoint]) -> list[StepCheckpoint]:
    """The checkpoints ``spec`` names; a listed step must exist, a range may be empty, the selection not."""
    if spec.strip() == "all":
        return available
    by_step = {c.step: c for c in available}
    wanted: set[int] = set()
    for part in (p.strip() for p in spec.split(",")):
        if part in ("first", "last") and by_step:
            wanted.add(min(by_step) if part == "first" else max(by_step))
        elif part.isdigit():
            if int(part) not in by_step:
                raise ArgumentError(f"--steps: no checkpoint for step {part} (have {sorted(by_step)})")
            wanted.add(int(part))
        elif match := _RANGE.match(part):
            low, high = int(match.group(1)), int(match.group(2))
            if low > high:
                raise ArgumentError(f"--steps: empty range {part!r}")
            wanted.update(s for s in by_step if low <= s <= high)
        else:
            raise ArgumentError(f"--steps: {part!r} is not a step, a range A-B, first, last, or 'all'")
    if not wanted:
        raise ArgumentError(f"--steps: {spec!r} selects no checkpoint (have {sorted(by_step)})")
    return [by_step[s] for s in sorted(wanted)]


def run_checkpoints(run: str, spec: str) -> tuple[str, str, list[StepCheckpoint]]:
    """The dump and checkpoint folders of ``run`` (either of them), and the checkpoints ``spec`` selects."""
    folder = find_checkpoint_folder(run)
    checkpoints = list_checkpoints(folder)
    if not checkpoints:
        raise CheckpointError(f"{folder}: no checkpoints (no step-N folders)")
    selected = select_steps(spec, checkpoints)
    return run_of(folder), folder, selected
