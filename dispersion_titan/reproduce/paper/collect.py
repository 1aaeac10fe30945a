"""Every number an artifact draws, read from the analyses its workflow made (``numbers``: what
``ARTIFACT.json`` holds), over the layer points each analysis was made with."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...analysis.condensation_schema import Condensation, LayerCondensation, read_analyses
from ...analysis.inputs import differences
from ...analysis.size_series import DEFAULT_LAST_N as LAST_N  # the layers averaged for a row's trend
from ...analysis.size_series import last_n_mean
from ...analysis.statistics import point_layers, rank_trend
from ...utils.errors import ArgumentError
from ...utils.hub import parse_spec
from .workflow import STAGE_BRANCH, PaperModel, PaperWorkflow

_TOKENS = re.compile(r"tokens(\d+(?:\.\d+)?[KMBT]?)", re.IGNORECASE)  # OLMo's branches: stage1-step1000-tokens5B: 5B


@dataclass(frozen=True)
class Entry:
    label: str
    row: str
    result: Condensation

    @property
    def layers(self) -> list[LayerCondensation]:
        return point_layers(self.result)

    @property
    def curve(self) -> list[float]:
        return [layer.mean_cos for layer in self.layers]

    @property
    def trend(self) -> dict:
        """The depth trend: Spearman and Kendall of mean_cos against layer index (embedding = 0)."""
        return rank_trend(list(range(len(self.curve))), self.curve)

    @property
    def inputs(self) -> dict:
        """What it was analysed with, but the token ids (they differ between tokenizers)."""
        return {k: v for k, v in self.result.inputs.items() if k != "tokens_sha256"}


def by_row(entries: list[Entry]) -> dict[str, list[Entry]]:
    """The entries of each row, rows and entries in workflow order."""
    rows: dict[str, list[Entry]] = {}
    for entry in entries:
        rows.setdefault(entry.row, []).append(entry)
    return rows


LAST_N_PANELS = (1, 2, 3, 4, 5)  # plot_trend.py --last-n, and half_n
AGAINST = {"fig3": "mlp_width", "fig4": "training_order", "counteract": "step"}  # a row's trend; else n_params


def half_n(points: int) -> int:
    return points // 2 + 1


def revision_label(revision: str) -> str:
    """Fig. 4's point names, as the paper's axis: ``stage2-step13000-...`` -> ``S2-13k``, ``main`` -> ``Main``."""
    match = STAGE_BRANCH.match(revision)
    if match:
        step = int(match.group(2))
        return f"S{match.group(1)}-{step // 1000}k" if step >= 1000 else f"S{match.group(1)}-{step}"
    return "Main" if revision == "main" else revision


def _missing(workflow: PaperWorkflow, model: PaperModel, what: str) -> ArgumentError:
    """Names the workflow's analyze command that makes it."""
    command = next(step.shell() for step in workflow.steps if step.argv[-1] == model.out)
    return ArgumentError(
        f"{workflow.artifact}: no analysis of {what} in {model.out}; "
        f"run {command} (or this command without --draw-only)"
    )


def _entries(workflow: PaperWorkflow, model: PaperModel) -> list[Entry]:
    found = read_analyses(model.out)
    steps = sorted(found[name].step for name in found if name.startswith("step-"))
    if workflow.artifact == "fig3":  # its first and last checkpoints: the earliest and latest step analysed
        if len(steps) < 2:
            raise _missing(workflow, model, f"{model.label}'s first and last checkpoints")
        drawn = {"first": found[f"step-{steps[0]}"], "last": found[f"step-{steps[-1]}"]}
        r = drawn["last"]  # a panel's title, as the authors' figure: the MLP width and the model's parameters
        label = f"MLP {r.mlp_width}" + (f" ({r.n_params / 1e6:.0f} M params)" if r.n_params else "")
        return [Entry(label, f"{row} checkpoint", drawn[row]) for row in workflow.rows]
    if workflow.artifact == "counteract":  # every checkpoint, titled by its step (plot_heatmaps.py)
        if not steps:
            raise _missing(workflow, model, f"{model.label}'s checkpoints")
        return [Entry(f"step {step}", model.row, found[f"step-{step}"]) for step in steps]
    if model.steps is not None:
        folder = f"step-{model.steps}"
        if folder not in found:
            raise _missing(workflow, model, f"{model.label} step {model.steps}")
        return [Entry(model.label, model.row or "runs", found[folder])]
    entries = []
    for revision in parse_spec(model.target).revisions:
        folder = f"rev-{revision.replace('/', '--')}" if revision else "rev-default"
        if folder not in found:
            raise _missing(workflow, model, f"{model.label}" + (f"@{revision}" if revision else ""))
        result = found[folder]
        label = model.label if revision is None else revision_label(revision)
        entries.append(Entry(label, model.row or str(result.model_args.get("model_type")), result))
    return entries


def entries(workflow: PaperWorkflow) -> list[Entry]:
    """Every model state of the workflow, in workflow order; refuses mixed inputs within a row."""
    found = [entry for model in workflow.models for entry in _entries(workflow, model)]
    for first, *others in by_row(found).values():
        for other in others:
            if other.inputs != first.inputs:
                raise ArgumentError(
                    f"{workflow.artifact}: {other.label} was analyzed with other inputs than "
                    f"{first.label} ({differences(first.inputs, other.inputs)}); use another --out"
                )
    return found


def model_numbers(entry: Entry) -> dict:
    r = entry.result
    return {
        "label": entry.label,
        "row": entry.row,
        "model": r.model or r.run,
        "revision": r.revision,
        "step": r.step,
        "tokens_seen": next(iter(_TOKENS.findall(r.revision or "")), None),
        "n_params": r.n_params,
        "layer_points": r.inputs["layer_points"],
        "layers": [layer.name for layer in entry.layers],
        "mean_cos": entry.curve,
        **entry.trend,
        f"mean_cos_last_{LAST_N}": last_n_mean(entry.result, LAST_N),
        "mean_cos_last_n": {str(n): last_n_mean(entry.result, n) for n in LAST_N_PANELS},
        "half_n": half_n(len(entry.curve)),
        "mean_cos_last_half": last_n_mean(entry.result, half_n(len(entry.curve))),
        "tokens_sha256": r.tokens_sha256,
    }


def row_numbers(workflow: PaperWorkflow, found: list[Entry]) -> list[dict]:
    rows = []
    for row, group in by_row(found).items():
        against = AGAINST.get(workflow.artifact, "n_params")
        # fig4: the revisions in training order (a stage's steps restart from 0)
        x = [float(getattr(e.result, against, i)) for i, e in enumerate(group)]
        y = [last_n_mean(e.result, LAST_N) for e in group]
        rows.append(
            {
                "row": row,
                "models": [e.label for e in group],
                "against": against,
                "x": x,
                f"mean_cos_last_{LAST_N}": y,
                **(rank_trend(x, y) if len(group) >= 2 else {"spearman": None, "kendall": None}),
            }
        )
    return rows


def pair_numbers(workflow: PaperWorkflow, found: list[Entry]) -> list[dict]:
    """fig5: distilled − base of the depth trend and of the last-n mean cosine, the i-th base with the i-th."""
    rows = by_row(found) if workflow.artifact == "fig5" else {"base": [], "distilled": []}
    return [
        {
            "base": base.label,
            "distilled": distilled.label,
            "delta_spearman": _delta(distilled.trend["spearman"]["rho"], base.trend["spearman"]["rho"]),
            "delta_kendall": _delta(distilled.trend["kendall"]["tau"], base.trend["kendall"]["tau"]),
            f"delta_mean_cos_last_{LAST_N}": last_n_mean(distilled.result, LAST_N) - last_n_mean(base.result, LAST_N),
        }
        for base, distilled in zip(rows["base"], rows["distilled"], strict=True)
    ]


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def numbers(workflow: PaperWorkflow, found: list[Entry]) -> dict:
    """``ARTIFACT.json``: everything drawn, and what it was measured on."""
    return {
        "artifact": workflow.artifact,
        "inputs": {row: group[0].inputs for row, group in by_row(found).items()},
        "depth_trend": "Spearman's rho and Kendall's tau of per-layer mean_cos against layer index "
        "(embedding = 0) over each model's layer points, two-sided p-values (scipy)",
        "last_n": "mean_cos_last_n: the mean of the last N layer points, N = 1..5; mean_cos_last_half: of "
        "the last half_n = L//2+1 of L points (the authors' plot_trend.py --last-n panels)",
        "models": [model_numbers(e) for e in found],
        "rows": row_numbers(workflow, found),
        "pairs": pair_numbers(workflow, found),
    }
