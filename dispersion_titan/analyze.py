"""``python -m dispersion_titan.analyze RUN|hf:MODEL`` and its ``compare`` and ``family`` commands:
arguments and dispatch. Checkpoints that cannot be read are reported and skipped (exit status 1)."""

from __future__ import annotations

import argparse
import os
import sys

from dispersion_titan.analysis import (
    ANALYSIS_PROTOCOLS,
    DEFAULT_GEOMETRY_SEQUENCES,
    DEFAULT_LAST_N,
    LAYER_POINTS,
    arguments,
)
from dispersion_titan.analysis.arguments import add_input_arguments  # paper's too
from dispersion_titan.config.cli import (
    OneLineErrorParser,
    add_device_arguments,
    add_results_arguments,
    named,
    named_out,
    non_negative_int,
    out_folder,
    positive_int,
)
from dispersion_titan.run_folder.outputs import REWRITTEN
from dispersion_titan.run_folder.owners import COMPARISON, FAMILY, owned
from dispersion_titan.utils.errors import command, run_command


def analyze_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.analyze",
        description="Embedding condensation (pairwise token cosine similarity by layer) of a run's "
        "checkpoints or of a Hugging Face model's revisions.",
        epilog="Compare analyzed runs: python -m dispersion_titan.analyze compare RUN_A RUN_B ... --out DIR; "
        "models of several sizes: python -m dispersion_titan.analyze family SPEC ... --out DIR",
    )
    p.add_argument(
        "run",
        metavar="RUN",
        type=named("a run folder, its checkpoint folder or hf:MODEL"),
        help="a run folder or its checkpoint folder, or hf:MODEL[@REV1,REV2,...] (hub id or local folder)",
    )
    p.add_argument("--steps", help="all (default), or steps and ranges such as 0,5,10-20, first, last (runs only)")
    add_input_arguments(p)
    p.add_argument(
        "--protocol",
        choices=ANALYSIS_PROTOCOLS,
        default="default",
        help="paper: the authors' inputs: 100 texts of >= 1024 words, each consecutive rows of "
        "wikitext-103-v1 train (or of --texts FILE) concatenated, the first 512 tokens of each with "
        "the tokenizer's default special tokens, and --layer-points hidden_states (default: default)",
    )
    p.add_argument(
        "--layer-points",
        choices=LAYER_POINTS,
        help="layers of the Spearman/Kendall depth trend: all (n+2, the default) or hidden_states "
        "(transformers' n+1, the default with --protocol paper)",
    )
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per forward pass (default 8)")
    p.add_argument(
        "--geometry-sequences",
        type=non_negative_int,
        default=DEFAULT_GEOMETRY_SEQUENCES,
        help=f"sequences averaged for effective rank and MEV (default {DEFAULT_GEOMETRY_SEQUENCES})",
    )
    p.add_argument("--out", type=named_out, help="output folder (default: RUN/condensation; required for hf:)")
    p.add_argument("--tb-dir", type=named_out, help="TensorBoard folder (default: RUN/tb/condensation, OUT/tb for hf:)")
    add_device_arguments(
        p, dtype_default=None, dtype_help="model dtype (default fp32; bf16 for hf: models over 1B parameters)"
    )
    p.add_argument("--device-map", choices=("auto",), help="hf: spread the model over all visible GPUs (accelerate)")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="hf: run the modelling code a model ships (the original Qwen's), as transformers' "
        "trust_remote_code; without it such a model is refused in one line",
    )
    add_results_arguments(p, "analyze", "results")
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.analyze compare",
        description="Condensation of several analyzed runs side by side (table, CSV, figure).",
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        type=named("a run folder or its condensation folder"),
        help="run folders or their condensation folders",
    )
    p.add_argument(
        "--out", type=out_folder, required=True, help="folder for compare.csv, compare_layers.csv and compare.png"
    )
    p.add_argument("--step", default="last", help="checkpoint step to compare, or last (default)")
    return p


def size_series_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog="python -m dispersion_titan.analyze family",
        description="Condensation against relative depth for models of several sizes, by family "
        "(paper Fig. 2), and the size trend per family.",
    )
    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        type=named("an analysed model's output folder or a run's folder"),
        help="an analysed hf: model's output folder[@REVISION], or a run's folder[@STEP]",
    )
    p.add_argument("--out", type=out_folder, required=True, help="folder for family.md, family.csv and family.png")
    p.add_argument(
        "--family",
        action="append",
        default=[],
        metavar="NAME=SPEC,SPEC",
        help="put these models in family NAME (default: HF model_type, 'gpt2 run' "
        "('qwen3_dispersion run', ...) for our runs)",
    )
    p.add_argument(
        "--paired",
        action="append",
        default=[],
        metavar="A=B",
        help="compare model A with model B (e.g. distilled with its base)",
    )
    p.add_argument(
        "--last-n",
        type=positive_int,
        default=DEFAULT_LAST_N,
        help=f"layers averaged at the end of depth (default {DEFAULT_LAST_N})",
    )
    p.add_argument(
        "--protocol",
        choices=ANALYSIS_PROTOCOLS,
        default="default",
        help="paper: require every model analysed with analyze --protocol paper (the authors' inputs "
        "and hidden_states layer points)",
    )
    return p


@command(REWRITTEN)
def summarize(argv: list[str]) -> None:
    """``compare`` and ``family``: results of several runs, rewritten whole (``owners.rewritten``)."""
    if argv[0] == "compare":
        a = compare_parser().parse_args(argv[1:])
        with owned(a.out, COMPARISON):  # from before torch's import: of two at once into one --out, one writes
            from dispersion_titan.analysis.compare import compare  # torch: after --help

            print(compare(a.runs, a.out, a.step))
        print(f"written: {os.path.join(a.out, 'compare.csv')}, compare_layers.csv, compare.png")
    else:
        a = size_series_parser().parse_args(argv[1:])
        with owned(a.out, FAMILY):
            from dispersion_titan.analysis.size_series import write_size_series  # torch: after --help

            print(write_size_series(a.specs, a.out, a.family, a.paired, a.last_n, a.protocol))
        print(f"written: {os.path.join(a.out, 'family.md')}, family.csv, family.png")
    sys.exit(0)


@command("each model state analyzed so far is kept in its folder; the same command analyzes the rest")
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["compare"], ["family"]):
        summarize(argv)
    a = analyze_parser().parse_args(argv)
    from dispersion_titan.analysis import runner  # torch: after --help

    analysis = runner.HFAnalysis if a.run.startswith(arguments.PREFIX) else runner.RunAnalysis
    sys.exit(1 if analysis(a, arguments.input_options(a)).analyze() else 0)


if __name__ == "__main__":
    run_command(main)
