"""Seeds of the training-time random draws, mixed from integers that do not depend on the
parallel layout (the run's seed, the step, a micro-batch's chunk of the global batch, ...)."""

from __future__ import annotations


def mixed_seed(*parts: int) -> int:
    """One 63-bit seed from ``parts``, in order."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % 2**63
    return seed
