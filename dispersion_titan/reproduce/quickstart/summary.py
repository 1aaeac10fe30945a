"""Analyzed runs of the sweep as ``RunCondensation`` records, and their measure: the late-block
cosine, the off-diagonal mean cosine (the diagonal would dominate the small values at initialization)
over the late half of the blocks, where condensation is strongest."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...analysis.compare import analyses_folder, load_runs
from ...analysis.condensation_schema import Condensation, LayerCondensation, read_results
from ...run_folder.checkpoints import dispersion_variant, load_run_metadata

VALIDATION_TAG = "validation_metrics/loss"


@dataclass(frozen=True)
class RunCondensation:
    """One run's analyses at initialization (step 0) and at its last analyzed step."""

    name: str
    width: int
    seed: int | None
    dispersion: str | None  # e.g. "angular_spread λ=1.0"; None for a baseline
    init: Condensation
    final: Condensation
    trajectory: dict[int, float]  # late-block cosine per step analyzed on the same sequences
    val_loss: float | None  # at the final step, if validation ran then

    @property
    def is_baseline(self) -> bool:
        return self.dispersion is None


def late_blocks(result: Condensation) -> list[LayerCondensation]:
    """The late half of the transformer blocks."""
    blocks = [layer for layer in result.layers if layer.name.startswith("block_")]
    return blocks[len(blocks) // 2 :]


def late_cos(result: Condensation) -> float:
    return float(np.mean([layer.mean_cos_offdiag for layer in late_blocks(result)]))


def embedding_cos(result: Condensation) -> float:
    return result.layers[0].mean_cos_offdiag


def final_validation_loss(dump: str, step: int) -> float | None:
    """The validation loss TensorBoard recorded at ``step`` (later event files win)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    value = None
    for events in sorted(glob.glob(os.path.join(dump, "tb", "*", "events.out.tfevents.*"))):
        acc = EventAccumulator(events, size_guidance={"scalars": 0})
        acc.Reload()
        if VALIDATION_TAG in acc.Tags()["scalars"]:
            value = next((e.value for e in acc.Scalars(VALIDATION_TAG) if e.step == step), value)
    return value


def load_sweep(dumps: Sequence[str]) -> list[RunCondensation]:
    """Each run's step-0 and last analyses, by width, baseline first; runs analyzed on different
    sequences are refused, as by ``analyze compare``."""
    init = load_runs(list(dumps), "0")
    final = load_runs(list(dumps), "last")
    runs = []
    for dump, first, last in zip(dumps, init, final):
        metadata = load_run_metadata(dump)  # one line if missing or of another format; else it records dispersion
        variant = dispersion_variant(dump)
        same_inputs = last.result.tokens_sha256
        analyses = read_results(analyses_folder(dump)).values()
        runs.append(
            RunCondensation(
                name=os.path.basename(os.path.normpath(dump)),
                width=last.result.mlp_width,
                seed=metadata.get("seed"),
                dispersion=None if variant == "none" else variant,
                init=first.result,
                final=last.result,
                trajectory={r.step: late_cos(r) for r in analyses if r.tokens_sha256 == same_inputs},
                val_loss=final_validation_loss(dump, last.result.step),
            )
        )
    return sorted(runs, key=lambda r: (r.width, not r.is_baseline, r.dispersion or "", r.seed or 0))


def peak(run: RunCondensation) -> tuple[int, float]:
    """(step, late-block cosine) of the most condensed checkpoint."""
    return max(run.trajectory.items(), key=lambda item: item[1])


def table_rows(runs: list[RunCondensation]) -> list[dict]:
    return [
        {
            "run": r.name,
            "MLP width": r.width,
            "dispersion": r.dispersion or "none",
            "seed": "-" if r.seed is None else r.seed,
            "late cos @0": f"{late_cos(r.init):.3f}",
            f"late cos @{r.final.step}": f"{late_cos(r.final):.3f}",
            f"last block @{r.final.step}": f"{r.final.layers[-2].mean_cos_offdiag:.3f}",
            "peak (step)": "{1:.3f} ({0})".format(*peak(r)),
            "Spearman @0": _rho(r.init),
            "Spearman final": _rho(r.final),
            "val loss": "-" if r.val_loss is None else f"{r.val_loss:.3f}",
        }
        for r in runs
    ]


def _rho(result: Condensation) -> str:
    return "-" if result.spearman is None else f"{result.spearman:+.2f}"
