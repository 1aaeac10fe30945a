"""fig3's runs: a preset's MLP-width sweep (the paper's ``train_configs/paper/fig3_gpt2_small*.toml``
by default, ours ``train_configs/gpt2_small_mlp*.toml`` with ``--preset ours``), each width in both
arms (cross-entropy only, angular_spread), trained under ``DIR/runs/``; and per width the one run the
authors' ``pretrain_toy_gpt2_change_ffn/plot_heatmaps.py`` draws (``pick_one_folder_per_ninner``):
a dispersion run before a cross-entropy-only one, then the lowest seed, the fewest steps, the last path."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...run_folder.checkpoints import find_checkpoint_folder, list_checkpoints, load_run_metadata
from ...utils.errors import CheckpointError
from . import catalog


@dataclass(frozen=True)
class SweepRun:
    """One run of the preset: its width, arm, training command (config and overrides) and folder."""

    width: int
    dispersion: bool
    config: str
    overrides: tuple[str, ...]
    folder: str

    @property
    def train_argv(self) -> list[str]:
        """``train.sbatch``'s (and ``launch/train.sh``'s) arguments."""
        return [self.config, *self.overrides, "--job.dump_folder", self.folder]


def preset_runs(preset: str, runs_dir: str) -> list[SweepRun]:
    """Every run of ``preset`` (``catalog.FIG3_PRESETS``), by width, the cross-entropy arm first."""
    configs, per_width = catalog.FIG3_PRESETS[preset]
    runs = []
    for width in catalog.FIG3_WIDTHS:
        for dispersion, config in zip((False, True), configs, strict=True):
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
    if not steps:
        return False
    return max(steps) == load_run_metadata(run.folder).get("training_steps")


def mlp_width(run: str) -> int:
    """The run's MLP width, from its ``run.json`` (GPT-2's 4·dim when unset)."""
    args = load_run_metadata(run)["model_args"]
    return args.get("mlp_hidden_dim") or 4 * args["dim"]


def _authors_key(run: str) -> tuple:
    """``plot_heatmaps.py``'s ``sort_key``: (dispersion run, −seed, −last step, path); the largest wins."""
    metadata = load_run_metadata(run)
    variant = (metadata.get("dispersion") or {}).get("variant", "none")
    seed = metadata.get("seed")
    steps = checkpoint_steps(run)
    return (variant != "none", -(seed if isinstance(seed, int) else -1), -(max(steps) if steps else -1), run)


def authors_pick(runs: list[str]) -> dict[int, tuple[str, list[str]]]:
    """Width -> (the run the authors' figure takes, the others of that width), widths ascending."""
    by_width: dict[int, list[str]] = {}
    for run in runs:
        by_width.setdefault(mlp_width(run), []).append(run)
    picked = {}
    for width in sorted(by_width):
        ordered = sorted(by_width[width], key=_authors_key)
        picked[width] = (ordered[-1], ordered[:-1])
    return picked


def pick_note(width: int, taken: str, others: list[str]) -> str:
    """What ``paper fig3`` says of a width with several runs."""
    arm = "a dispersion run" if _authors_key(taken)[0] else "a cross-entropy-only run"
    return (
        f"fig3: MLP {width}: takes {taken} ({arm}) over {', '.join(others)}, as the authors' "
        "plot_heatmaps.py: a dispersion run first, then the lowest seed, the fewest steps"
    )
