"""The MLP-width × variant × seed experiment grid, and its one naming scheme.

The quickstart and ``python -m dispersion_titan.sweep`` both train this grid; each cell is a set of
training overrides and a run folder named ``w{width}-{variant}-s{seed}``, the variant
``baseline`` (plain training), ``{name}-c{coeff}`` (a dispersion loss) or a baseline
method the paper compares against (``noisy_embedding``, ``active_forgetting``). Light:
no torch, so the sweep's dry run is fast.
"""

from __future__ import annotations

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
    def label(self) -> str:
        if self.method != "none":
            return self.method
        return BASELINE if self.name == "none" else f"{self.name}-c{self.coeff:g}"

    @property
    def is_baseline(self) -> bool:
        """Plain training: neither a dispersion loss nor a baseline method."""
        return self.name == "none" and self.method == "none"


@dataclass(frozen=True)
class Cell:
    width: int
    arm: Arm
    seed: int

    @property
    def name(self) -> str:
        return f"w{self.width}-{self.arm.label}-s{self.seed}"

    def overrides(self, dump_folder: str) -> list[str]:
        """The training command line's grid part, writing into ``dump_folder``."""
        return [
            "--model.mlp_hidden_dim",
            str(self.width),
            "--dispersion.variant",
            self.arm.name,
            "--dispersion.coeff",
            f"{self.arm.coeff:g}",
            "--baseline.method",
            self.arm.method,
            "--debug.seed",
            str(self.seed),
            "--job.dump_folder",
            dump_folder,
        ]


def cells(
    widths: list[int] | tuple[int, ...], arms: list[Arm] | tuple[Arm, ...], seeds: list[int] | tuple[int, ...]
) -> list[Cell]:
    """Every combination, width-major (the order of the folders, jobs and tables)."""
    return [Cell(w, a, s) for w in widths for a in arms for s in seeds]
