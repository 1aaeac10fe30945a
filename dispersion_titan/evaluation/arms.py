"""The rows of the paper's Table 2, which ``table`` builds and ``figure`` draws."""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import mean_accuracy

SIGNIFICANCE = ((0.001, "***"), (0.01, "**"), (0.05, "*"))


@dataclass(frozen=True)
class RunScores:
    """One run's selected checkpoint."""

    run: str
    dump: str  # the run's dump folder, holding run.json
    step: int
    scores: dict[str, float]
    settings: dict

    @property
    def average(self) -> float:
        return mean_accuracy(self.scores)


@dataclass(frozen=True)
class ArmRow:
    name: str
    runs: list[RunScores]
    mean: dict[str, float]
    std: dict[str, float]
    average_mean: float
    average_std: float
    rank: float
    p_value: float | None

    @property
    def significance(self) -> str:
        return next((stars for level, stars in SIGNIFICANCE if self.p_value is not None and self.p_value < level), "")
