"""The MLP-width × variant × seed grid the quickstart and ``sweep`` train, and its run names
``w{width}-{label}-s{seed}`` (``baseline``, ``{variant}-c{coeff}`` or a baseline method). No torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BASELINE = "baseline"

GRID_KEYS = (
    "--model.mlp_hidden_dim",
    "--dispersion.variant",
    "--dispersion.coeff",
    "--baseline.method",
    "--debug.seed",
    "--job.dump_folder",
)
"""Training overrides the grid sets for each cell; given by hand they would fight it."""


@dataclass(frozen=True)
class Arm:
    """One arm of the experiment: plain training, a dispersion loss, or a baseline method."""

    name: str
    """A dispersion variant, or ``none``."""
    coeff: float
    """``[dispersion] coeff``: λ after its warm-up."""
    method: str = "none"
    """``baseline.method``: a baseline method instead of a dispersion loss, or ``none``."""

    @property
    def coeff_text(self) -> str:
        """λ as the cell's name and command line give it: short, and exact (``:g`` alone made 0.1234567 0.123457)."""
        short = f"{self.coeff:g}"
        return short if float(short) == self.coeff else repr(self.coeff)

    @property
    def label(self) -> str:
        if self.method != "none":
            return self.method
        return BASELINE if self.name == "none" else f"{self.name}-c{self.coeff_text}"


@dataclass(frozen=True)
class Cell:
    width: int
    arm: Arm
    seed: int

    @property
    def name(self) -> str:
        return f"w{self.width}-{self.arm.label}-s{self.seed}"

    def overrides(self, dump_folder: str) -> list[str]:
        """The training command line's grid part (``GRID_KEYS``), writing into ``dump_folder``."""
        values = (str(self.width), self.arm.name, self.arm.coeff_text, self.arm.method, str(self.seed), dump_folder)
        return [word for pair in zip(GRID_KEYS, values, strict=True) for word in pair]


def cells(widths: Sequence[int], arms: Sequence[Arm], seeds: Sequence[int]) -> list[Cell]:
    """Every combination, width-major (the order of the folders, jobs and tables)."""
    return [Cell(w, a, s) for w in widths for a in arms for s in seeds]
