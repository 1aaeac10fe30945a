"""Seeds of training-time draws, mixed from layout-free integers (seed, step, chunk, ...)."""

from __future__ import annotations


def mixed_seed(*parts: int) -> int:
    """One 63-bit seed from ``parts``, in order."""
    seed = 0
    for part in parts:
        seed = (seed * 1_000_003 + part) % 2**63
    return seed
