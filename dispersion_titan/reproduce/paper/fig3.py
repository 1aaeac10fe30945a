"""fig3's runs: a preset's MLP-width sweep, both arms per width, trained under ``DIR/runs/``; and
per width the one drawn (``--pick``): its cross-entropy-only run (``ce``: the paper's claim is about
plain pre-training), or the authors' ``plot_heatmaps.py`` pick (``authors``: a dispersion run first)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...run_folder.checkpoints import find_checkpoint_folder, list_checkpoints, load_run_metadata
from ...utils.errors import ArgumentError, CheckpointError
from . import catalog


@dataclass(frozen=True)
class SweepRun:
    width: int
    dispersion: bool
    config: str
    overrides: tuple[str, ...]
    folder: str

    @property
    def train_argv(self) -> list[str]:
        """``train.sbatch``'s (and ``launch/train.sh``'s)."""
        return [self.config, *self.overrides, "--job.dump_folder", self.folder]


def preset_runs(preset: str, runs_dir: str) -> list[SweepRun]:
    """Every run of ``preset``, by width, the cross-entropy arm first."""
    spec = catalog.FIG3_PRESETS[preset]
    per_width = "{width}" in spec.configs[0]  # one config per width, else --model.mlp_hidden_dim W
    runs = []
    for width in spec.widths:
        for dispersion, config in zip((False, True), spec.configs, strict=True):
            config = config.format(width=width)
            overrides = () if per_width else ("--model.mlp_hidden_dim", str(width))
            name = os.path.basename(config).removesuffix(".toml").replace("_angular_spread", "")
            name = (name if per_width else f"{name}_mlp{width}") + ("_angular_spread" if dispersion else "")
            runs.append(SweepRun(width, dispersion, config, overrides, os.path.join(runs_dir, name)))
    return runs


def checkpoint_steps(run: str) -> list[int]:
    """The steps of the run's checkpoints (none: not trained yet)."""
    try:
        return [c.step for c in list_checkpoints(find_checkpoint_folder(run))]
    except CheckpointError:
        return []


def is_trained(run: SweepRun) -> bool:
    """Whether the run holds its last step's checkpoint (``run.json``'s ``training_steps``)."""
    steps = checkpoint_steps(run.folder)
    return bool(steps) and max(steps) == load_run_metadata(run.folder).get("training_steps")


def mlp_width(run: str) -> int:
    """The run's MLP width, from its ``run.json`` (GPT-2's 4·dim when unset)."""
    args = load_run_metadata(run)["model_args"]
    return args.get("mlp_hidden_dim") or 4 * args["dim"]


def _key(run: str) -> tuple:
    """``plot_heatmaps.py``'s ``sort_key``: (dispersion run, −seed, −last step, path); the largest wins."""
    metadata = load_run_metadata(run)
    variant = (metadata.get("dispersion") or {}).get("variant", "none")
    seed = metadata.get("seed")
    steps = checkpoint_steps(run)
    return (variant != "none", -(seed if isinstance(seed, int) else -1), -(max(steps) if steps else -1), run)


def pick(runs: list[str], rule: str) -> dict[int, tuple[str, str | None]]:
    """Width -> (the run drawn under ``rule``, what ``paper fig3`` says of a width with several runs), widths
    ascending."""
    by_width: dict[int, list[str]] = {}
    for run in runs:
        by_width.setdefault(mlp_width(run), []).append(run)
    why = (
        "--pick ce: the cross-entropy run, then the lowest seed, the fewest steps"
        if rule == "ce"
        else "as the authors' plot_heatmaps.py: a dispersion run first, then the lowest seed, the fewest steps"
    )
    picked = {}
    for width in sorted(by_width):
        ordered = sorted(by_width[width], key=_key)  # the cross-entropy runs first
        ce = [run for run in ordered if not _key(run)[0]]
        if rule == "ce" and not ce:
            raise ArgumentError(
                f"fig3: MLP {width}: no cross-entropy-only run among {', '.join(ordered)}; give one, or "
                "--pick authors to draw a dispersion run as plot_heatmaps.py does"
            )
        taken = ce[-1] if rule == "ce" else ordered[-1]
        others = ", ".join(run for run in ordered if run != taken)
        arm = "a dispersion run" if _key(taken)[0] else "a cross-entropy-only run"
        picked[width] = (taken, f"fig3: MLP {width}: takes {taken} ({arm}) over {others}, {why}" if others else None)
    return picked
