"""What ``trainer.step_measure`` measures of one training step on rank 0 of a planned world, and
its extrapolation in depth: every block is alike, so memory and time are linear in the number
of blocks."""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = {
    "parameters": ("Sharded Param", "Unsharded Param", "Parameter", "Buffer"),
    "gradients": ("Sharded Grad", "Unsharded Grad", "Gradient"),
    "optimizer": ("OptState", "Optstate"),
    "activations": ("Activation",),
    "temporaries": ("Temp",),
    "collectives": ("All Gather", "Reduce Scatter"),
    "other": ("Inputs", "Other"),
}
"""PyTorch's memory trackers' categories (``FSDPMemTracker``'s, ``MemTracker``'s) as a plan shows them."""


@dataclass(frozen=True)
class StepMeasurement:
    memory: dict[str, float]
    """Bytes per ``CATEGORIES`` key at the step's peak."""
    micro_batch_s: float
    """Roofline seconds of one micro-batch's forward and backward."""
    optimizer_s: float
    """Roofline seconds of clipping and the optimizer step."""
    params_local: float
    """Parameters this rank holds (its shards)."""
    params_total: float
    depth: int
    """Blocks of the model measured (or extrapolated to)."""
    term_s: float = 0.0
    """Seconds of one micro-batch's dispersion term at its kernels' measured rate (``figures.term_seconds``),
    outside the roofline and its calibration."""

    @property
    def peak(self) -> float:
        return sum(self.memory.values())


def categorised(by_type: dict) -> dict[str, float]:
    """A tracker's snapshot of one device (its categories by enum) in ``CATEGORIES``."""
    named = {getattr(key, "value", key): value for key, value in by_type.items()}
    return {name: float(sum(named.get(k, 0) for k in keys)) for name, keys in CATEGORIES.items()}


def on_the_line(a: StepMeasurement, b: StepMeasurement, depth: int) -> StepMeasurement:
    """The measurement at ``depth`` blocks on the line through ``a`` and ``b``."""
    w = (depth - a.depth) / (b.depth - a.depth)

    def at(x: float, y: float) -> float:
        return x + (y - x) * w

    return StepMeasurement(
        {k: at(a.memory[k], b.memory[k]) for k in a.memory},
        at(a.micro_batch_s, b.micro_batch_s),
        at(a.optimizer_s, b.optimizer_s),
        at(a.params_local, b.params_local),
        at(a.params_total, b.params_total),
        depth,
        at(a.term_s, b.term_s),
    )
