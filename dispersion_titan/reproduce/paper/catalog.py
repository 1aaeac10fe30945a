"""The paper's models and configurations for each artifact, as the authors' Readme runs them
(ChenLiu-1996/LM-Dispersion), and the compute each needs. Sizes are nominal (the figures use the
count ``analyze`` measures); GPU-hours are estimates, never measurements."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ...utils.errors import docs_page

SIZE_SERIES: dict[str, dict[str, float]] = {  # family -> hub id -> nominal billions of parameters
    "GPT-2": {
        "openai-community/gpt2": 0.124,
        "openai-community/gpt2-medium": 0.355,
        "openai-community/gpt2-large": 0.774,
        "openai-community/gpt2-xl": 1.5,
    },
    "Qwen": {"Qwen/Qwen-1_8B": 1.8, "Qwen/Qwen-7B": 7, "Qwen/Qwen-14B": 14, "Qwen/Qwen-72B": 72},
    "Qwen2.5": {
        "Qwen/Qwen2.5-0.5B": 0.5,
        "Qwen/Qwen2.5-1.5B": 1.5,
        "Qwen/Qwen2.5-3B": 3,
        "Qwen/Qwen2.5-7B": 7,
        "Qwen/Qwen2.5-14B": 14,
        "Qwen/Qwen2.5-32B": 32,
        "Qwen/Qwen2.5-72B": 72,
    },
    "Qwen3": {
        "Qwen/Qwen3-0.6B": 0.6,
        "Qwen/Qwen3-1.7B": 1.7,
        "Qwen/Qwen3-4B": 4,
        "Qwen/Qwen3-8B": 8,
        "Qwen/Qwen3-14B": 14,
        "Qwen/Qwen3-32B": 32,
    },
    "BLOOM": {
        "bigscience/bloom-560m": 0.56,
        "bigscience/bloom-1b1": 1.1,
        "bigscience/bloom-1b7": 1.7,
        "bigscience/bloom-3b": 3,
        "bigscience/bloom-7b1": 7.1,
    },
}
GPT2_HUB_IDS = tuple(SIZE_SERIES["GPT-2"])
DISTILLATION_PAIRS: dict[tuple[str, str], float] = {  # (base, distilled), plot_trend.py --paired's order: billions
    ("Qwen/Qwen2.5-Math-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"): 1.5,
    ("Qwen/Qwen2.5-Math-7B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"): 7,
    ("Qwen/Qwen2.5-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B"): 14,
    ("Qwen/Qwen2.5-32B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"): 32,
}
OLMO = "allenai/Olmo-3-1025-7B"  # Fig. 4's model; its revisions are its hub branches
FIG4_STAGES, FIG4_PER_STAGE = (1, 2, 3), 4  # per pre-training stage 4 branches, then main
FIG4_REVISIONS = len(FIG4_STAGES) * FIG4_PER_STAGE + 1


@dataclass(frozen=True)
class Fig3Preset:
    configs: tuple[str, str]  # cross-entropy, angular_spread; "{width}": one per width
    widths: tuple[int, ...]


FIG3_PRESETS: dict[str, Fig3Preset] = {
    # the authors' pretrain_toy_gpt2.py defaults at the widths of their figure (assets/controlled_experiment.png:
    # MLP 64, 256, 1024 and 4096, 69 M to 143 M parameters)
    "paper": Fig3Preset(
        ("train_configs/paper/fig3_gpt2_small.toml", "train_configs/paper/fig3_gpt2_small_angular_spread.toml"),
        (64, 256, 1024, 4096),
    ),
    # ours on the embedded Wikipedia sample, GPT-2 small's widths 1/4 to 2x its own
    "ours": Fig3Preset(
        ("train_configs/gpt2_small_mlp{width}.toml", "train_configs/gpt2_small_mlp{width}_angular_spread.toml"),
        (768, 1536, 3072, 6144),
    ),
}
FIG3_PICKS = ("ce", "authors")  # --pick: the cross-entropy run, or plot_heatmaps.py's (a dispersion run first)
FIG3_ROWS = {"last": ("last",), "first,last": ("first", "last")}  # --rows: the paper's one, or plot_heatmaps.py's
FIG3_SEQ_LEN = 1024  # plot_heatmaps.py --max_length 1024 (the other figures: 512)


@dataclass(frozen=True)
class Table2Row:
    """One row of the paper's Table 2: a mid-training config, or (the Pretrained row) the hub model it starts from."""

    block: str
    label: str
    config: str | None = None  # the config that trains it; None: the Pretrained row
    model: str | None = None  # the Pretrained row's hub model, evaluated as it is


def _midtrain_block(block: str, hub_id: str, stem: str, rows: tuple[tuple[str, str], ...]) -> tuple[Table2Row, ...]:
    return (
        Table2Row(block, "Pretrained", model=hub_id),
        *(Table2Row(block, label, config=f"train_configs/paper/midtrain_{stem}_{arm}.toml") for label, arm in rows),
    )


_GPT2_ROWS = (
    ("Default loss", "baseline"),
    ("NEFTune", "neftune"),
    ("Active forgetting", "active_forgetting"),
    ("Decorrelation", "decorrelation"),
    ("ℓ2-repel", "l2_repel"),
    ("Angular spread", "dispersion"),
    ("Orthogonalization", "orthogonalization"),
)
_QWEN3_ROWS = (("Default loss", "baseline"), ("Angular spread", "angular_spread"))
TABLE2_ROWS: tuple[Table2Row, ...] = (
    *_midtrain_block("GPT2", GPT2_HUB_IDS[0], "gpt2_wikitext103", _GPT2_ROWS),
    *_midtrain_block("GPT2-medium", GPT2_HUB_IDS[1], "gpt2-medium_wikitext103", (_GPT2_ROWS[0], _GPT2_ROWS[5])),
    Table2Row("GPT2-large", "Pretrained", model=GPT2_HUB_IDS[2]),
    Table2Row("GPT2-xl", "Pretrained", model=GPT2_HUB_IDS[3]),
    *_midtrain_block("Qwen3-0.6B", "Qwen/Qwen3-0.6B", "qwen3_0.6b", _QWEN3_ROWS),
    *_midtrain_block("Qwen3-1.7B", "Qwen/Qwen3-1.7B", "qwen3_1.7b", _QWEN3_ROWS),
)
TABLE2_CONFIGS = tuple(row.config for row in TABLE2_ROWS if row.config)
COUNTERACT_CONFIGS = (
    "train_configs/paper/midtrain_gpt2_wikitext103_baseline.toml",
    "train_configs/paper/midtrain_gpt2_wikitext103_dispersion.toml",
)
COUNTERACT_TEXTS, COUNTERACT_SEQ_LEN = 10, 1024  # plot_heatmaps.py's repetitions and max_length
REMOTE_CODE = frozenset(SIZE_SERIES["Qwen"])  # models that ship their own modelling code
ROBUSTNESS_CORPORA: dict[str, str | None] = {
    # name -> our registered dataset (--dataset), or None: give a jsonl with --corpus NAME=FILE
    "wikitext-103": "wikitext-103",
    "pubmed_qa": None,
    "imdb": None,
    "squad": None,
}
"""The authors' ``--dataset wikipedia|pubmed|imdb|squad`` (``key_observations/utils/text_data.py``)."""
PAPER_CORPUS = "wikitext-103"  # the corpus analyze --protocol paper reads by itself

SIZES_B = {  # by the hub id's last part: a local folder of that name is that model
    **{hub_id.rsplit("/", 1)[-1]: size for series in SIZE_SERIES.values() for hub_id, size in series.items()},
    **{hub_id.rsplit("/", 1)[-1]: size for pair, size in DISTILLATION_PAIRS.items() for hub_id in pair},
    "Olmo-3-1025-7B": 7,
}


def gpus_needed(billions: float, dtype: str = "fp32") -> int:
    """80 GB GPUs that hold the weights in ``dtype`` with 20% headroom (fp32, the artifacts' default:
    one up to ~16B parameters; several, with --device-map auto, above)."""
    return max(1, math.ceil(billions * {"fp32": 4, "bf16": 2}[dtype] * 1.2 / 80))


def size_b(model: str) -> float | None:
    return SIZES_B.get(os.path.basename(os.path.normpath(model)))


def analysis_gpu_hours(billions: float) -> float:
    """Estimate for one model state at K=100, S=512: reading the checkpoint (~2 GB per billion,
    the hub's bf16, at ~1 GB/s) dominates the forward passes (2·N·51,200 FLOPs)."""
    return 0.02 + billions * 2 / 3600


def _models_line(models: tuple[str, ...]) -> str:
    return ", ".join(f"{m} ({size_b(m):g}B)" for m in models)


def _hours(models: tuple[str, ...], states: int = 1) -> str:
    hours = sum(analysis_gpu_hours(size_b(m)) for m in models) * states
    biggest = max(size_b(m) for m in models)
    gpus = (
        f"largest {biggest:g}B: {gpus_needed(biggest)} GPUs in fp32 (--device-map auto; --dtype bf16 halves the memory)"
        if gpus_needed(biggest) > 1
        else f"largest {biggest:g}B: one 80 GB GPU in fp32"
    )
    return f"~{hours:.1f} GPU-hours (estimate, not measured; {gpus}; plus downloading the weights)"


ARTIFACTS: dict[str, tuple[str, str, str, str]] = {  # name -> (the paper's figure, what runs, models, compute)
    "fig2": (
        "Fig. 2 and S1: larger models condense less",
        "analyze hf:MODEL per model; per-model cosine heatmaps (layer fraction x cosine, density over the "
        "S x S entries averaged over K sequences) and the Spearman/Kendall depth-trend panel per family, "
        "with the family statistic (Spearman of size vs last-3-layer mean cosine)",
        "; ".join(f"{name}: {_models_line(models)}" for name, models in SIZE_SERIES.items())
        + " (Qwen only with --trust-remote-code: it ships its own modelling code)",
        _hours(tuple(m for models in SIZE_SERIES.values() for m in models)),
    ),
    "fig3": (
        "Fig. 3: MLP width only",
        "train the preset (--slurm), then analyze RUN --steps first,last per width at 1024 tokens; a row of "
        "heatmaps titled by width and parameters, and the width trend (Spearman, Kendall)",
        f"{' and '.join(FIG3_PRESETS['paper'].configs)} at MLP width "
        f"{', '.join(map(str, FIG3_PRESETS['paper'].widths))} (GPT-2 small's other shapes, 69 M to 143 M "
        "parameters; drawn: each width's cross-entropy run at its last checkpoint, --pick authors and --rows "
        "first,last as plot_heatmaps.py); --preset ours: train_configs/gpt2_small_mlp*.toml at "
        f"{', '.join(map(str, FIG3_PRESETS['ours'].widths))}; --models RUN ... for runs trained elsewhere",
        "training: eight GPT-2-small-shaped runs of 2.5B tokens (paper fig3 --plan; see "
        f"{docs_page('reproduction.md')}); "
        "analysis ~0.1 GPU-hours (estimate, not measured)",
    ),
    "fig4": (
        "Fig. 4: condensation from initialization",
        "analyze hf:MODEL@REV1,...; one heatmap per revision, annotated with its tokens seen, and the "
        "depth trend over training",
        f"{OLMO} (7B): {FIG4_REVISIONS} states, {FIG4_PER_STAGE} branches of each of stages 1-3 from its "
        "first to its last and the final model (listed from the "
        "hub at run time; --revisions names others)",
        f"~{analysis_gpu_hours(7) * FIG4_REVISIONS:.1f} GPU-hours (estimate, not measured; one 80 GB GPU; "
        f"plus downloading {FIG4_REVISIONS} x 14 GB)",
    ),
    "fig5": (
        "Fig. 5: distillation",
        "analyze hf:MODEL per model; bases (top row) and distilled models (bottom row), the paired "
        "depth-trend panel and the paired differences",
        "; ".join(f"{a} vs {b}" for a, b in DISTILLATION_PAIRS),
        _hours(tuple(m for pair in DISTILLATION_PAIRS for m in pair)),
    ),
    "table2": (
        "Table 2: downstream evaluation",
        "evaluate RUN per run (arms x seeds), then evaluate table --select best; mean ± std per task "
        "and average, significance against the reference arm; Markdown and LaTeX",
        f"the runs of the {len(TABLE2_CONFIGS)} train_configs/paper/midtrain_*.toml (GPT2: the baseline, NEFTune, "
        "active forgetting and four dispersion losses; GPT2-medium, Qwen3-0.6B and -1.7B: baseline and "
        "angular_spread), several seeds each, given with --models [ARM=]RUN,...; the Pretrained rows of GPT2 "
        "small to xl and Qwen3 from hub ids (--plan lists every row)",
        "training: the mid-training runs; evaluation ~0.3 GPU-hours per checkpoint for GPT-2 (11 tasks, "
        "limit 500; estimate, not measured)",
    ),
    "counteract": (
        "Fig. (dispersion counteracts condensation): mid-training with and without the loss, step by step",
        "analyze RUN --steps all for the two runs at 10 texts of 1024 tokens (plot_heatmaps.py); a row per "
        "run of heatmaps titled by step, and the depth trend against step",
        f"the runs of {' and '.join(COUNTERACT_CONFIGS)} (their run folders, or --models BASE DISPERSION)",
        "training: the two GPT-2 mid-training runs (paper table2 --plan); analysis ~0.05 GPU-hours for 12 "
        "checkpoints (estimate, not measured)",
    ),
    "robustness": (
        "Fig. S (dataset robustness): the same trend on other texts",
        "analyze hf:MODEL per model and corpus; fig2's panels, one row per corpus",
        f"{_models_line(GPT2_HUB_IDS)} on {', '.join(ROBUSTNESS_CORPORA)}",
        _hours(GPT2_HUB_IDS, states=len(ROBUSTNESS_CORPORA)),
    ),
}


def listing() -> str:
    """What ``--list`` prints."""
    return "\n\n".join(
        f"{name}  ({paper})\n  runs:    {runs}\n  models:  {models}\n  compute: {compute}"
        for name, (paper, runs, models, compute) in ARTIFACTS.items()
    )


def pretrained_rows() -> str:
    """``table2 --plan``'s Pretrained rows: they train nothing."""
    pretrained = [row for row in TABLE2_ROWS if row.model]
    trained = {row.block for row in TABLE2_ROWS if row.config}
    lines = [
        f"\nand {len(pretrained)} Pretrained rows, no training (0 GPU-hours): step 0 of the block's baseline runs, "
        "or (GPT2-large, -xl) the hub model evaluated as published:"
    ]
    for row in pretrained:
        option = "auto" if row.block in trained else f"hf:{row.model}"
        lines.append(f"| {row.block}: {row.label} | {row.model} | --pretrained {option} |")
    return "\n".join(lines)
