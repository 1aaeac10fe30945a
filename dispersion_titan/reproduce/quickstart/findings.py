"""The paper's four findings, each set against what the quickstart measured (the init panel and the
trained toy sweep, its analyzed runs as ``RunCondensation`` records). Their measure is the late-block
cosine: the off-diagonal mean cosine (the diagonal would dominate the small values at initialization)
over the late half of the blocks, where condensation is strongest. A verdict is computed from the
numbers only: **agrees** only where the effect exceeds the measured seed-to-seed spread of the same
quantity, **within noise at this scale** where it does not; where it does not agree, ``scale`` names
the config and command that test it at scale. ``summary.md`` sets them out with the setup, the table
and the files.
"""

from __future__ import annotations

import glob
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from ...analysis.compare import analyses_folder, load_runs
from ...analysis.condensation_schema import Condensation, LayerCondensation, read_results
from ...run_folder.checkpoints import dispersion_variant, load_run_metadata
from ...run_folder.outputs import format_table
from ...utils.errors import docs_page

AGREES, DISAGREES, NOISE = "agrees", "disagrees", "within noise at this scale"
DIGITS = 3  # effects and spreads are compared as written: the verdict follows the numbers a reader sees
PRESENT_MARGIN = 0.1  # "present": the late blocks' cosine above the embedding's (random vectors give ≈ 0) by this

VALIDATION_TAG = "validation_metrics/loss"


@dataclass(frozen=True)
class RunCondensation:
    """One run's analyses at initialization (step 0) and at its last analyzed step."""

    name: str
    width: int
    seed: int
    dispersion: str | None  # e.g. "angular_spread λ=1.0"; None for a baseline
    init: Condensation
    final: Condensation
    trajectory: dict[int, float]  # late-block cosine per step analyzed on the same sequences
    val_loss: float | None  # at the final step, if validation ran then

    @property
    def is_baseline(self) -> bool:
        return self.dispersion is None


@dataclass(frozen=True)
class InitPanel:
    """Condensation at initialization of a shape too large to train here (``pipeline.init_panel``)."""

    widths: dict[int, Condensation]  # per MLP width, at the main seed
    seeds: dict[int, Condensation]  # the narrowest width per seed, the main one first


def late_blocks(result: Condensation) -> list[LayerCondensation]:
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
        metadata = load_run_metadata(dump)  # one line if missing or of another format; else it records seed, dispersion
        variant = dispersion_variant(dump)
        same_inputs = last.result.tokens_sha256
        analyses = read_results(analyses_folder(dump)).values()
        runs.append(
            RunCondensation(
                name=os.path.basename(os.path.normpath(dump)),
                width=last.result.mlp_width,
                seed=metadata["seed"],  # the quickstart passes each run its --debug.seed
                dispersion=None if variant == "none" else variant,
                init=first.result,
                final=last.result,
                trajectory={r.step: late_cos(r) for r in analyses if r.tokens_sha256 == same_inputs},
                val_loss=final_validation_loss(dump, last.result.step),
            )
        )
    return sorted(runs, key=lambda r: (r.width, not r.is_baseline, r.dispersion or "", r.seed))


def peak(run: RunCondensation) -> tuple[int, float]:
    """(step, late-block cosine) of the most condensed checkpoint."""
    return max(run.trajectory.items(), key=lambda item: item[1])


def table_rows(runs: list[RunCondensation]) -> list[dict]:
    return [
        {
            "run": r.name,
            "MLP width": r.width,
            "dispersion": r.dispersion or "none",
            "seed": r.seed,
            "late cos @0": f"{late_cos(r.init):.3f}",
            f"late cos @{r.final.step}": f"{late_cos(r.final):.3f}",
            f"last block @{r.final.step}": f"{r.final.layers[-2].mean_cos_offdiag:.3f}",
            "peak (step)": "{1:.3f} ({0})".format(*peak(r)),
            "Spearman @0": _spearman(r.init),
            "Spearman final": _spearman(r.final),
            "val loss": "-" if r.val_loss is None else f"{r.val_loss:.3f}",
        }
        for r in runs
    ]


def _spearman(result: Condensation) -> str:
    """As the table and the findings both print it."""
    return "-" if result.spearman is None else f"{result.spearman:+.2f}"


GPU_TRAINING = (
    "launch/train.sh train_configs/gpt2_small_mlp3072.toml (a GPU node), then "
    "python -m dispersion_titan.analyze on its step-0 … final checkpoints"
)


@dataclass(frozen=True)
class Part:
    scope: str  # what was measured, e.g. "GPT-2 small shape, step 0"
    measured: str  # the measured direction with its numbers
    verdict: str
    effect: float  # positive: the paper's direction
    spread: float | None  # the seed-to-seed spread of the same quantity; None: unmeasured
    decides: bool = True  # False for context: shown, not part of the verdict

    @property
    def noise(self) -> str:
        """Both numbers, as every verdict is written."""
        against = "seed spread unmeasured" if self.spread is None else f"seed spread {self.spread:.{DIGITS}f}"
        return f"effect {self.effect:+.{DIGITS}f}, {against}"


@dataclass(frozen=True)
class Finding:
    question: str
    paper: str  # the direction the paper reports, and where
    parts: tuple[Part, ...]
    scale: str  # what a disagreement needs, and the config and command that test it

    @property
    def verdict(self) -> str:
        return combined(part.verdict for part in self.parts if part.decides)


def judge(effect: float, spread: float | None, threshold: float = 0.0) -> str:
    """Within noise when no larger than the seed ``spread`` (None: the sign alone decides), else
    agrees when above ``threshold``."""
    if spread is not None and round(abs(effect), DIGITS) <= round(spread, DIGITS):
        return NOISE
    return AGREES if effect > threshold else DISAGREES


def combined(verdicts: Iterable[str]) -> str:
    """Several measurements: any disagreement disagrees; agrees only when all agree."""
    verdicts = list(verdicts)
    if not verdicts or DISAGREES in verdicts:
        return DISAGREES
    return AGREES if all(v == AGREES for v in verdicts) else NOISE


def smallest(scope: str, measured: str, effects: Sequence[float], spread: float | None) -> Part:
    """Several effects of one measurement, each judged against ``spread``; the smallest is the one shown."""
    return Part(scope, measured, combined(judge(x, spread) for x in effects), min(effects, default=0.0), spread)


def seed_spread(runs: Sequence[RunCondensation], value: Callable[[RunCondensation], float | None]) -> float | None:
    """The largest difference in ``value`` between two seeds of the same width and arm."""
    groups = defaultdict(list)
    for run in runs:
        if (v := value(run)) is not None:
            groups[run.width, run.dispersion].append(v)
    return max((max(g) - min(g) for g in groups.values() if len(g) > 1), default=None)


def init_spread(panel: InitPanel) -> float | None:
    """The init panel's seed-to-seed spread of the late-block cosine (its narrowest width)."""
    values = [late_cos(r) for r in panel.seeds.values()]
    return max(values) - min(values) if len(values) > 1 else None


def _values(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _trend(values: Sequence[float]) -> str:
    signs = tuple(set(np.sign(np.diff(values)).tolist()))  # one: monotone
    trends = {(-1.0,): "wider MLPs condense less", (1.0,): "wider MLPs condense more"}
    return trends.get(signs, "no monotone trend with width")


def present(
    scope: str, measured: str, results: Sequence[Condensation], spread: float | None, decides: bool = True
) -> Part:
    """Condensation present in every one of ``results``: the smallest rise from the embedding to the
    late blocks, with the cosine rising with depth."""
    rise = min(late_cos(r) - embedding_cos(r) for r in results)
    rising = all((r.spearman or 0) > 0 for r in results)
    return Part(scope, measured, judge(rise, spread, PRESENT_MARGIN) if rising else DISAGREES, rise, spread, decides)


def panel_shape(panel: InitPanel) -> str:
    args = next(iter(panel.widths.values())).model_args
    return f"init panel: dim {args['dim']}, {args['n_layers']} blocks"


def baselines(runs: Sequence[RunCondensation], seed: int) -> list[RunCondensation]:
    return sorted((r for r in runs if r.is_baseline and r.seed == seed), key=lambda r: r.width)


def final_spread(runs: Sequence[RunCondensation]) -> float | None:
    return seed_spread(runs, lambda r: late_cos(r.final))


def at_initialization(panel: InitPanel, runs: Sequence[RunCondensation], seed: int) -> Finding:
    widths = sorted(panel.widths)
    results = [panel.widths[w] for w in widths]
    toy = baselines(runs, seed)  # never empty: every width has its baseline at the main seed
    args = toy[0].init.model_args
    return Finding(
        "Is condensation present at initialization?",
        "yes: already at initialization the cosine rises with depth (Feature 2, Fig. 3; Feature 3)",
        (
            present(
                f"{panel_shape(panel)}, step 0",
                f"late-block cosine {_values([late_cos(r) for r in results])} vs embedding "
                f"{_values([embedding_cos(r) for r in results])} at MLP width {' / '.join(map(str, widths))}; "
                f"Spearman with depth {' / '.join(map(_spearman, results))}; "
                "the smallest rise from the embedding",
                results,
                init_spread(panel),
            ),
            present(
                f"trained toy model (dim {args['dim']}, {args['n_layers']} blocks), step 0",
                f"late-block cosine {_values([late_cos(r.init) for r in toy])} vs embedding "
                f"{_values([embedding_cos(r.init) for r in toy])}; the smallest rise from the embedding",
                [r.init for r in toy],
                seed_spread(runs, lambda r: late_cos(r.init)),
                decides=False,
            ),
        ),
        f"condensation at initialization needs depth and residual width ({docs_page('reproduction.md')}): "
        "the init panel "
        "of GPT-2 small's shape (python -m dispersion_titan.quickstart --init-flavor small, the default) shows it; "
        "a model of dim 64 and 4 blocks does not",
    )


def with_width(panel: InitPanel, runs: Sequence[RunCondensation], seed: int) -> Finding:
    widths = sorted(panel.widths)
    init = [late_cos(panel.widths[w]) for w in widths]
    spread, lowered = init_spread(panel), (-np.diff(init)).tolist()  # how much each widening lowers the cosine
    parts = [
        smallest(
            f"{panel_shape(panel)}, step 0",
            f"{_trend(init)}: late-block cosine {_values(init)} at MLP width {' / '.join(map(str, widths))}; "
            "the smallest step",
            lowered,
            spread,
        )
    ]
    toy = baselines(runs, seed)
    if len({r.width for r in toy}) > 1:
        final = [late_cos(r.final) for r in toy]
        parts.append(
            smallest(
                f"trained toy model, step {toy[0].final.step}",
                f"{_trend(final)}: {_values(final)} at MLP width {' / '.join(str(r.width) for r in toy)}; "
                "the smallest step",
                (-np.diff(final)).tolist(),
                final_spread(runs),
            )
        )
    return Finding(
        "How does it change with MLP width?",
        "wider MLPs condense less, at initialization and after training (Feature 2)",
        tuple(parts),
        f"the paper trains GPT-2-small-sized models that differ only in MLP width: {GPU_TRAINING} "
        "for each of train_configs/gpt2_small_mlp{768,1536,3072,6144}.toml",
    )


def with_training(runs: Sequence[RunCondensation], seed: int) -> Finding:
    toy = baselines(runs, seed)
    drops = [late_cos(r.init) - late_cos(r.final) for r in toy]
    peaks = [peak(r) for r in toy]
    return Finding(
        "How does it change with training?",
        "pre-training gradually mitigates it: the cosine falls from its level at initialization "
        "(Feature 3, OLMo's checkpoints)",
        (
            smallest(
                f"trained toy model, step 0 → {toy[0].final.step}",
                f"late-block cosine {_values([late_cos(r.init) for r in toy])} → "
                f"{_values([late_cos(r.final) for r in toy])} at MLP width {' / '.join(str(r.width) for r in toy)} "
                f"(down in {sum(d > 0 for d in drops)} of {len(toy)}; peak {_values([v for _, v in peaks])} at step "
                f"{'/'.join(str(s) for s, _ in peaks)}); the smallest fall",
                drops,
                final_spread(runs),
            ),
        ),
        "a model that condenses at initialization (GPT-2 small's shape, the init panel) and a long pre-training past "
        f"the early collapse onto the unigram distribution: {GPU_TRAINING}; or published checkpoints, "
        "python -m dispersion_titan.analyze on a model's intermediate revisions",
    )


def with_dispersion(runs: Sequence[RunCondensation], seed: int) -> Finding:
    baseline = {r.width: r for r in baselines(runs, seed)}
    pairs = [  # never empty: every width has both arms at the main seed
        (baseline[r.width], r)
        for r in sorted(runs, key=lambda r: r.width)
        if not r.is_baseline and r.seed == seed and r.width in baseline
    ]
    lowered = [late_cos(b.final) - late_cos(d.final) for b, d in pairs]
    last = [(b.final.layers[-2].mean_cos_offdiag, d.final.layers[-2].mean_cos_offdiag) for b, d in pairs]
    parts = [
        smallest(
            f"trained toy model, step {pairs[0][1].final.step}",
            "late-block cosine baseline → dispersion: "
            + ", ".join(f"{late_cos(b.final):.3f} → {late_cos(d.final):.3f} at width {b.width}" for b, d in pairs)
            + f"; the last block alone: {', '.join(f'{x:.3f} → {y:.3f}' for x, y in last)}; the smallest fall",
            lowered,
            final_spread(runs),
        )
    ]
    losses = [(b.val_loss, d.val_loss) for b, d in pairs if b.val_loss is not None and d.val_loss is not None]
    if losses:
        base_loss, disp_loss = np.mean(losses, axis=0)
        parts.append(
            smallest(
                "validation loss (mean over widths)",
                f"{base_loss:.3f} → {disp_loss:.3f}; the fall",
                [base_loss - disp_loss],
                seed_spread(runs, lambda r: r.val_loss),
            )
        )
    return Finding(
        "What does the dispersion loss do to it?",
        "it spreads tokens apart (lower cosine) without hurting, and at scale improving, generalization (Table 2)",
        tuple(parts),
        f"downstream accuracy needs GPT-2-small-sized runs and lm-eval: {GPU_TRAINING}, then "
        "python -m dispersion_titan.evaluate on baseline and dispersion runs over several seeds",
    )


def findings(panel: InitPanel, runs: Sequence[RunCondensation], seed: int) -> list[Finding]:
    return [
        at_initialization(panel, runs, seed),
        with_width(panel, runs, seed),
        with_training(runs, seed),
        with_dispersion(runs, seed),
    ]


def findings_markdown(found: Sequence[Finding]) -> list[str]:
    """One block per finding: the question, the paper, each measurement and its verdict."""
    lines = []
    for number, finding in enumerate(found, start=1):
        lines += [f"### {number}. {finding.question} — **{finding.verdict}**", "", f"- Paper: {finding.paper}."]
        lines += [
            f"- Measured ({part.scope}): {part.measured} ({part.noise}) — **{part.verdict}**"
            + ("." if part.decides else " (context, not part of the verdict).")
            for part in finding.parts
        ]
        if any(part.verdict != AGREES for part in finding.parts):
            lines.append(f"- Scale needed: {finding.scale}.")
        lines.append("")
    return lines


def summary_markdown(
    runs: list[RunCondensation], found: Sequence[Finding], setup: str, files: Sequence[tuple[str, str]]
) -> str:
    """``summary.md``: the setup, the table, the paper's findings against the measurements, the files."""
    first = runs[0].final
    late = ", ".join(layer.name for layer in late_blocks(first))
    counts = Counter(f.verdict for f in found)
    tally = ", ".join(f"{counts[v]} {v}" for v in (NOISE, DISAGREES) if counts[v])
    lines = [
        "# Embedding condensation: MLP width × dispersion loss, against the paper",
        "",
        setup,
        "",
        "```",
        format_table(table_rows(runs)),
        "```",
        "",
        f"## The paper's findings, measured here: {counts[AGREES]} of {len(found)} agree"
        + (f"; {tally}" if tally else ""),
        "",
        *findings_markdown(found),
        f"late cos = off-diagonal mean cosine (mean_cos_offdiag) between the tokens of one sequence, averaged "
        f"over the late half of the blocks ({late} of the toy model); last block = the last block alone. "
        f"Measured on the same {first.num_sequences} held-out sequences of {first.seq_len} tokens for every "
        "checkpoint. Spearman = rank correlation of the mean cosine with depth (embedding … final norm); "
        "val loss at the final step.",
        "",
        "Figures and tables:",
        *(f"- {description}: {path}" for description, path in files),
    ]
    return "\n".join(lines) + "\n"
