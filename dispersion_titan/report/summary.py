"""From analyzed runs (an MLP-width sweep, with and without a dispersion loss) to a table
and one sentence per question. Every verdict is computed from the measured numbers and
quotes them, so the text can never claim more than the runs show.

The measure is the *late-block cosine*: the off-diagonal mean cosine between the token
hidden states of one sequence (the diagonal's 1/S share would otherwise dominate the
small values at initialization), averaged over the late half of the blocks, where
condensation is strongest.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..analysis.compare import analyses_folder, dispersion_variant, format_table, load_runs
from ..analysis.result import Condensation, LayerCondensation
from ..analysis.results import read_results
from ..errors import AnalysisError

VALIDATION_TAG = "validation_metrics/loss"
QUESTIONS = (
    "Is condensation present at initialization?",
    "How does it change with training?",
    "How does it change with MLP width?",
    "What does the dispersion loss do to it?",
)


@dataclass(frozen=True)
class RunCondensation:
    """One run's analyses at initialization (step 0) and at its last analyzed step."""

    name: str
    width: int
    dispersion: str | None  # e.g. "angular_spread λ=1.0"; None for a baseline
    init: Condensation
    final: Condensation
    trajectory: dict[int, float]  # late-block cosine of every step analyzed on the same sequences
    val_loss: float | None  # validation loss at the final step, if validation ran then

    @property
    def is_baseline(self) -> bool:
        return self.dispersion is None


def late_blocks(result: Condensation) -> list[LayerCondensation]:
    """The late half of the transformer blocks (block_3 and block_4 of 4)."""
    blocks = [layer for layer in result.layers if layer.name.startswith("block_")]
    return blocks[len(blocks) // 2:]


def late_cos(result: Condensation) -> float:
    return float(np.mean([layer.mean_cos_offdiag for layer in late_blocks(result)]))


def embedding_cos(result: Condensation) -> float:
    return result.layers[0].mean_cos_offdiag


def rises_with_depth(result: Condensation) -> bool:
    """Condensation in one checkpoint: cosine grows with depth, late blocks above the embedding."""
    return result.spearman is not None and result.spearman > 0 and late_cos(result) > embedding_cos(result)


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
    """Each run's step-0 and last analyses, sorted by width, baseline first; refuses runs
    analyzed on different token sequences (``AnalysisError``, like ``analyze compare``)."""
    init = load_runs(list(dumps), "0")
    final = load_runs(list(dumps), "last")
    runs = []
    for dump, first, last in zip(dumps, init, final):
        variant = dispersion_variant(dump)
        if variant is None:  # never guess "baseline" for a run whose settings are unknown
            raise AnalysisError(f"{os.path.join(dump, 'run.json')}: no dispersion settings recorded; "
                                "runs must be trained by dispersion_titan.train")
        same_inputs = last.result.tokens_sha256
        analyses = read_results(analyses_folder(dump)).values()
        runs.append(RunCondensation(
            name=os.path.basename(os.path.normpath(dump)),
            width=last.result.mlp_width,
            dispersion=None if variant == "none" else variant,
            init=first.result,
            final=last.result,
            trajectory={r.step: late_cos(r) for r in analyses if r.tokens_sha256 == same_inputs},
            val_loss=final_validation_loss(dump, last.result.step),
        ))
    return sorted(runs, key=lambda r: (r.width, not r.is_baseline, r.dispersion or ""))


def _baselines(runs: list[RunCondensation]) -> list[RunCondensation]:
    """The runs without dispersion loss (all runs if there are none)."""
    return [r for r in runs if r.is_baseline] or runs


def _values(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in values)


def _span(values: Sequence[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}–{high:.3f}"


def _final_step(runs: list[RunCondensation]) -> str:
    steps = sorted({r.final.step for r in runs})
    return "step " + "/".join(map(str, steps))


def answer_init(runs: list[RunCondensation]) -> str:
    base = _baselines(runs)
    rising = sum(rises_with_depth(r.init) for r in base)
    verdict = "Yes" if rising == len(base) else "No" if rising == 0 else "In some widths"
    spearman = [r.init.spearman for r in base if r.init.spearman is not None]
    rho = f"Spearman {min(spearman):+.2f} to {max(spearman):+.2f}" if spearman else "no rank correlation"
    return (f"{verdict}: at step 0 the cosine rises with depth in {rising} of {len(base)} widths ({rho}); "
            f"{np.mean([embedding_cos(r.init) for r in base]):.3f} at the embedding vs "
            f"{np.mean([late_cos(r.init) for r in base]):.3f} in the late blocks (mean over widths).")


def peak(run: RunCondensation) -> tuple[int, float]:
    """(step, late-block cosine) of the most condensed checkpoint."""
    return max(run.trajectory.items(), key=lambda item: item[1])


def answer_training(runs: list[RunCondensation]) -> str:
    base = _baselines(runs)
    up = sum(late_cos(r.final) > late_cos(r.init) for r in base)
    verdict = "Training raises it" if up == len(base) else "Training lowers it" if up == 0 else "Mixed"
    text = (f"{verdict}: the late-block cosine goes from {_span([late_cos(r.init) for r in base])} at step 0 "
            f"to {_span([late_cos(r.final) for r in base])} at {_final_step(base)} "
            f"(up in {up} of {len(base)} {'baseline ' if base[0].is_baseline else ''}runs)")
    earlier = [peak(r) for r in base if peak(r)[0] not in (0, r.final.step)]
    if earlier:
        steps = "/".join(str(step) for step in sorted({step for step, _ in earlier}))
        text += (f"; in {len(earlier)} of {len(base)} runs it peaks on the way, at {_span([v for _, v in earlier])} "
                 f"(step {steps}), and falls afterwards")
    return text + "."


def _width_trend(values: Sequence[float]) -> str:
    steps = np.diff(values)
    if (steps < 0).all():
        return "narrower MLPs condense more"
    if (steps > 0).all():
        return "wider MLPs condense more"
    return "no monotone trend with width"


def answer_width(runs: list[RunCondensation]) -> str:
    base = sorted(_baselines(runs), key=lambda r: r.width)
    widths = [r.width for r in base]
    if len(set(widths)) < 2:
        return "Not measured: the runs have a single MLP width."
    init = [late_cos(r.init) for r in base]
    final = [late_cos(r.final) for r in base]
    return (f"At step 0 {_width_trend(init)} (late-block cosine {_values(init)} for MLP width "
            f"{' / '.join(map(str, widths))}); at {_final_step(base)} {_width_trend(final)} ({_values(final)}).")


def answer_dispersion(runs: list[RunCondensation]) -> str:
    baseline = {r.width: r for r in runs if r.is_baseline}
    pairs = [(baseline[r.width], r) for r in runs if not r.is_baseline and r.width in baseline]
    if not pairs:
        return "Not measured: no width has both a baseline and a dispersion run."
    lower = sum(late_cos(d.final) < late_cos(b.final) for b, d in pairs)
    verdict = "It lowers it" if lower == len(pairs) else "It raises it" if lower == 0 else "Mixed"
    variants = sorted({d.dispersion for _, d in pairs})
    detail = ", ".join(f"{late_cos(b.final):.3f} → {late_cos(d.final):.3f} at width {b.width}" for b, d in pairs)
    text = (f"{verdict}: with {' / '.join(variants)} the late-block cosine at {_final_step([d for _, d in pairs])} "
            f"is lower than the baseline's in {lower} of {len(pairs)} widths (baseline → dispersion: {detail})")
    losses = [(b.val_loss, d.val_loss) for b, d in pairs if b.val_loss is not None and d.val_loss is not None]
    if losses:
        base_loss, disp_loss = np.mean(losses, axis=0)
        text += f"; validation loss {base_loss:.3f} → {disp_loss:.3f} (mean over widths)"
    return text + "."


def answers(runs: list[RunCondensation]) -> list[str]:
    """One sentence per entry of ``QUESTIONS``."""
    return [answer_init(runs), answer_training(runs), answer_width(runs), answer_dispersion(runs)]


def table_rows(runs: list[RunCondensation]) -> list[dict]:
    return [
        {
            "run": r.name,
            "MLP width": r.width,
            "dispersion": r.dispersion or "none",
            "late cos @0": f"{late_cos(r.init):.3f}",
            f"late cos @{r.final.step}": f"{late_cos(r.final):.3f}",
            "peak (step)": "{1:.3f} ({0})".format(*peak(r)),
            "Spearman @0": _rho(r.init),
            "Spearman final": _rho(r.final),
            "val loss": "-" if r.val_loss is None else f"{r.val_loss:.3f}",
        }
        for r in runs
    ]


def _rho(result: Condensation) -> str:
    return "-" if result.spearman is None else f"{result.spearman:+.2f}"


def markdown(runs: list[RunCondensation], setup: str, files: Sequence[tuple[str, str]]) -> str:
    """The whole summary: setup, table, answers, what the numbers are, where the files are."""
    first = runs[0].final
    late = ", ".join(layer.name for layer in late_blocks(first))
    lines = [
        "# Embedding condensation: MLP width × dispersion loss",
        "",
        setup,
        "",
        "```",
        format_table(table_rows(runs)),
        "```",
        "",
        *(f"- **{q}** {a}" for q, a in zip(QUESTIONS, answers(runs))),
        "",
        f"late cos = off-diagonal mean cosine between the tokens of one sequence, averaged over {late}; "
        f"measured on the same {first.num_sequences} held-out sequences of {first.seq_len} tokens "
        "for every checkpoint. Spearman = rank correlation of the mean cosine with depth "
        "(embedding … final norm); val loss at the final step.",
        "",
        "Figures and tables:",
        *(f"- {description}: {path}" for description, path in files),
    ]
    return "\n".join(lines) + "\n"
