"""The paper's four findings, each set against what the quickstart measured.

Every ``Finding`` states the direction the paper reports, the direction measured here
with its numbers, and whether they agree, computed from those numbers only (so a
changed number changes the verdict). Where a measurement disagrees, ``scale`` says what
is known to be needed and which config and command test it at that scale.

Two sources of numbers: the init panel (freshly initialised models of GPT-2 small's
shape, ``init_panel``) and the trained toy sweep (``summary.RunCondensation``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ...analysis.condensation_schema import Condensation
from .summary import RunCondensation, embedding_cos, late_cos

PRESENT_MARGIN = 0.1
"""Condensation is "present" when the late blocks' off-diagonal cosine exceeds the
embedding's by at least this much (random token vectors in d dimensions give ≈ 0)."""

GPU_TRAINING = ("launch/train.sh train_configs/gpt2_small_mlp3072.toml (a GPU node), then "
                "python -m dispersion_titan.analyze on its step-0 … final checkpoints")


@dataclass(frozen=True)
class Part:
    scope: str
    """What was measured, e.g. "GPT-2 small shape, step 0"."""
    measured: str
    """The measured direction with its numbers."""
    agrees: bool
    decides: bool = True
    """False for context (e.g. the toy model at step 0): shown, but not part of the verdict."""


@dataclass(frozen=True)
class Finding:
    question: str
    paper: str
    """The direction the paper reports, and where."""
    parts: tuple[Part, ...]
    scale: str
    """What a disagreement needs, and the config and command that test it at that scale."""

    @property
    def agrees(self) -> bool:
        return all(part.agrees for part in self.parts if part.decides)


def _values(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _decreasing(values: Sequence[float]) -> bool:
    return len(values) > 1 and bool((np.diff(values) < 0).all())


def _trend(values: Sequence[float]) -> str:
    if _decreasing(values):
        return "wider MLPs condense less"
    if len(values) > 1 and (np.diff(values) > 0).all():
        return "wider MLPs condense more"
    return "no monotone trend with width"


def _present(result: Condensation) -> bool:
    return late_cos(result) - embedding_cos(result) >= PRESENT_MARGIN and (result.spearman or 0) > 0


def panel_shape(panel: dict[int, Condensation]) -> str:
    args = next(iter(panel.values())).model_args
    return f"init panel: dim {args['dim']}, {args['n_layers']} blocks"


def _baselines(runs: Sequence[RunCondensation], seed: int) -> list[RunCondensation]:
    return sorted((r for r in runs if r.is_baseline and r.seed == seed), key=lambda r: r.width)


def at_initialization(panel: dict[int, Condensation], runs: Sequence[RunCondensation], seed: int) -> Finding:
    widths = sorted(panel)
    toy = _baselines(runs, seed)
    parts = [Part(
        f"{panel_shape(panel)}, step 0",
        f"late-block cosine {_values([late_cos(panel[w]) for w in widths])} vs embedding "
        f"{_values([embedding_cos(panel[w]) for w in widths])} at MLP width {' / '.join(map(str, widths))}; "
        f"Spearman with depth {_values([panel[w].spearman or 0.0 for w in widths])}",
        all(_present(panel[w]) for w in widths),
    )]
    if toy:
        args = toy[0].init.model_args
        parts.append(Part(
            f"trained toy model (dim {args['dim']}, {args['n_layers']} blocks), step 0",
            f"late-block cosine {_values([late_cos(r.init) for r in toy])} vs embedding "
            f"{_values([embedding_cos(r.init) for r in toy])}",
            all(_present(r.init) for r in toy),
            decides=False,
        ))
    return Finding(
        "Is condensation present at initialization?",
        "yes: already at initialization the cosine rises with depth (Feature 2, Fig. 3; Feature 3)",
        tuple(parts),
        "condensation at initialization needs depth and residual width (docs/reproduction.md): the init panel "
        "of GPT-2 small's shape (python -m dispersion_titan.quickstart --init-flavor small, the default) shows it; "
        "a model of dim 64 and 4 blocks does not",
    )


def with_width(panel: dict[int, Condensation], runs: Sequence[RunCondensation], seed: int) -> Finding:
    widths = sorted(panel)
    init = [late_cos(panel[w]) for w in widths]
    toy = _baselines(runs, seed)
    final = [late_cos(r.final) for r in toy]
    parts = [Part(f"{panel_shape(panel)}, step 0",
                  f"{_trend(init)}: late-block cosine {_values(init)} at MLP width {' / '.join(map(str, widths))}",
                  _decreasing(init))]
    if len({r.width for r in toy}) > 1:
        parts.append(Part(
            f"trained toy model, step {toy[0].final.step}",
            f"{_trend(final)}: {_values(final)} at MLP width {' / '.join(str(r.width) for r in toy)}",
            _decreasing(final),
        ))
    return Finding(
        "How does it change with MLP width?",
        "wider MLPs condense less, at initialization and after training (Feature 2)",
        tuple(parts),
        f"the paper trains GPT-2-small-sized models that differ only in MLP width: {GPU_TRAINING} "
        "for each of train_configs/gpt2_small_mlp{768,1536,3072,6144}.toml",
    )


def with_training(runs: Sequence[RunCondensation], seed: int) -> Finding:
    toy = _baselines(runs, seed)
    down = [late_cos(r.final) < late_cos(r.init) for r in toy]
    peaks = [max(r.trajectory.items(), key=lambda item: item[1]) for r in toy]
    return Finding(
        "How does it change with training?",
        "pre-training gradually mitigates it: the cosine falls from its level at initialization "
        "(Feature 3, OLMo's checkpoints)",
        (Part(
            f"trained toy model, step 0 → {toy[0].final.step}",
            f"late-block cosine {_values([late_cos(r.init) for r in toy])} → "
            f"{_values([late_cos(r.final) for r in toy])} at MLP width {' / '.join(str(r.width) for r in toy)} "
            f"(down in {sum(down)} of {len(toy)}; peak {_values([v for _, v in peaks])} at step "
            f"{'/'.join(str(s) for s, _ in peaks)})",
            all(down),
        ),),
        "a model that condenses at initialization (GPT-2 small's shape, the init panel) and a long pre-training past "
        f"the early collapse onto the unigram distribution: {GPU_TRAINING}; or published checkpoints, "
        "python -m dispersion_titan.analyze on a model's intermediate revisions",
    )


def seed_spread(runs: Sequence[RunCondensation]) -> float | None:
    """The largest validation-loss difference between two seeds of the same width and arm."""
    gaps = []
    for a in runs:
        for b in runs:
            same = (a.width, a.dispersion) == (b.width, b.dispersion) and a.seed < b.seed
            if same and a.val_loss is not None and b.val_loss is not None:
                gaps.append(abs(a.val_loss - b.val_loss))
    return max(gaps) if gaps else None


def with_dispersion(runs: Sequence[RunCondensation], seed: int) -> Finding:
    baseline = {r.width: r for r in _baselines(runs, seed)}
    pairs = [(baseline[r.width], r) for r in sorted(runs, key=lambda r: r.width)
             if not r.is_baseline and r.seed == seed and r.width in baseline]
    lower = [late_cos(d.final) < late_cos(b.final) for b, d in pairs]
    last = [(b.final.layers[-2].mean_cos_offdiag, d.final.layers[-2].mean_cos_offdiag) for b, d in pairs]
    parts = [Part(
        f"trained toy model, step {pairs[0][1].final.step}" if pairs else "trained toy model",
        "late-block cosine baseline → dispersion: "
        + ", ".join(f"{late_cos(b.final):.3f} → {late_cos(d.final):.3f} at width {b.width}" for b, d in pairs)
        + f"; the last block alone: {', '.join(f'{x:.3f} → {y:.3f}' for x, y in last)}",
        bool(pairs) and all(lower),
    )]
    losses = [(b.val_loss, d.val_loss) for b, d in pairs if b.val_loss is not None and d.val_loss is not None]
    spread = seed_spread(runs)
    if losses:
        base_loss, disp_loss = np.mean(losses, axis=0)
        noise = f"seed-to-seed spread {spread:.3f}" if spread is not None else "seed-to-seed spread unmeasured"
        parts.append(Part(
            "validation loss (mean over widths)",
            f"{base_loss:.3f} → {disp_loss:.3f} ({disp_loss - base_loss:+.3f}; {noise})",
            spread is not None and disp_loss - base_loss <= spread,
        ))
    return Finding(
        "What does the dispersion loss do to it?",
        "it spreads tokens apart (lower cosine) without hurting, and at scale improving, generalization "
        "(Table 2)",
        tuple(parts),
        f"downstream accuracy needs GPT-2-small-sized runs and lm-eval: {GPU_TRAINING}, then "
        "python -m dispersion_titan.evaluate on baseline and dispersion runs over several seeds",
    )


def findings(panel: dict[int, Condensation], runs: Sequence[RunCondensation], seed: int) -> list[Finding]:
    return [at_initialization(panel, runs, seed), with_width(panel, runs, seed), with_training(runs, seed),
            with_dispersion(runs, seed)]


def markdown(found: Sequence[Finding]) -> list[str]:
    """One block per finding: the question, the paper, each measurement and its verdict."""
    lines = []
    for number, finding in enumerate(found, start=1):
        verdict = "agrees" if finding.agrees else "disagrees"
        lines += [f"### {number}. {finding.question} — **{verdict}**", "", f"- Paper: {finding.paper}."]
        lines += [f"- Measured ({part.scope}): {part.measured} — **{'agrees' if part.agrees else 'disagrees'}**"
                  + ("." if part.decides else " (context, not part of the verdict).") for part in finding.parts]
        if not all(part.agrees for part in finding.parts):
            lines.append(f"- Scale needed: {finding.scale}.")
        lines.append("")
    return lines
