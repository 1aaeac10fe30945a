"""``table.png``: the table's headline, average accuracy per arm, readable at a glance."""

from __future__ import annotations

import numpy as np

from ..run_folder.outputs import headless_pyplot, save_png
from .arms import ArmRow

plt = headless_pyplot()


def average_accuracy_figure(rows: list[ArmRow], reference: str, tasks: int, rule: str, test: str, path: str) -> None:
    """Bars: mean over seeds with ± std error bars; dots: the seeds; stars: ``test`` (the
    t-test's name) against the reference arm (hatched)."""
    fig, ax = plt.subplots(figsize=(max(6.4, 1.6 * len(rows) + 2), 4.6), layout="constrained")
    x = np.arange(len(rows))
    means = [row.average_mean for row in rows]
    errors = [0 if np.isnan(row.average_std) else row.average_std for row in rows]
    bars = ax.bar(x, means, yerr=errors, capsize=6, color="#8fb3d9", edgecolor="#1f4e79", width=0.6)
    for index, row in enumerate(rows):
        if row.name == reference:
            bars[index].set_hatch("//")
        seeds = [run.average for run in row.runs]
        ax.scatter(
            np.full(len(seeds), index) + np.linspace(-0.12, 0.12, len(seeds)),
            seeds,
            color="black",
            s=14,
            zorder=3,
            label="seeds" if index == 0 else None,
        )
        if row.significance:
            ax.annotate(
                row.significance,
                (index, means[index] + errors[index]),
                ha="center",
                va="bottom",
                xytext=(0, 4),
                textcoords="offset points",
                fontsize=12,
            )
    low = min(min(run.average for run in row.runs) for row in rows)
    high = max(max(run.average for run in row.runs) for row in rows)
    span = max(high - low, 0.01)
    ax.set_ylim(max(0.0, low - 0.6 * span), high + 0.6 * span)
    labels = [
        f"{row.name.replace(', ', chr(10))}\n({len(row.runs)} seed{'s' if len(row.runs) > 1 else ''})" for row in rows
    ]
    ax.set_xticks(x, labels, fontsize=9)
    ax.set_ylabel(f"average accuracy over {tasks} tasks")
    ax.set_title(
        f"Average accuracy per arm (checkpoint: {rule})\n"
        f"{test} t-test vs the hatched arm: * p<0.05, ** p<0.01, *** p<0.001",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper right")
    save_png(fig, path)
