"""Condensation analysis of saved checkpoints.

    python -m dispersion_titan.analyze RUN [--steps 0,5,10-20] [--num-sequences 100] [--seq-len 512] ...
    python -m dispersion_titan.analyze compare RUN_A RUN_B ... --out DIR [--step N|last]

RUN is a run's dump folder or its checkpoint folder. Bad options fail with one line
naming the option, file or folder (exit 2); checkpoints that cannot be read are
reported and skipped, and the exit status is then 1.
"""

from __future__ import annotations

import argparse
import sys

from dispersion_titan.config.cli import OneLineErrorParser, add_device_arguments, positive_int
from dispersion_titan.errors import DispersionTitanError, fail


def _seq_len(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 2 (pairs of tokens are measured)")
    return int(text)


def analyze_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m dispersion_titan.analyze",
                description="Embedding condensation (pairwise token cosine similarity by layer) of a run's checkpoints.",
                epilog="Compare analyzed runs: python -m dispersion_titan.analyze compare RUN_A RUN_B ... --out DIR")
    p.add_argument("run", metavar="RUN", help="the run's dump folder or its checkpoint folder")
    p.add_argument("--steps", default="all", help="all (default), or steps and ranges such as 0,5,10-20")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--dataset", default=None,
                        help="registered dataset whose validation split is used (default: enwiki_sample)")
    source.add_argument("--texts", metavar="FILE", help="jsonl file with a \"text\" field per line")
    p.add_argument("--dataset-path", "--dataset_path", dest="dataset_path", help="files for --dataset local")
    p.add_argument("--num-sequences", type=positive_int, default=100, help="K sequences (default 100)")
    p.add_argument("--seq-len", type=_seq_len, default=512, help="S tokens per sequence (default 512)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sequence choice (default 0)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per forward pass (default 8)")
    p.add_argument("--out", help="output folder (default: RUN/condensation)")
    p.add_argument("--tb-dir", help="TensorBoard folder (default: RUN/tb/condensation)")
    add_device_arguments(p)
    p.add_argument("--force", action="store_true", help="recompute steps already analyzed")
    return p


def compare_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m dispersion_titan.analyze compare",
                description="Condensation of several analyzed runs side by side (table, CSV, figure).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="dump folders or their condensation folders")
    p.add_argument("--out", required=True, help="folder for compare.csv, compare_layers.csv and compare.png")
    p.add_argument("--step", default="last", help="checkpoint step to compare, or last (default)")
    return p


def run_analyze(argv: list[str]) -> int:
    from dispersion_titan.analysis.inputs import DEFAULT_DATASET, InputOptions
    from dispersion_titan.analysis.runner import AnalyzeOptions, RunAnalysis

    a = analyze_parser().parse_args(argv)
    if a.dataset_path and a.texts:
        fail("--dataset-path: not used with --texts")
    inputs = InputOptions(
        dataset=None if a.texts else (a.dataset or DEFAULT_DATASET),
        dataset_path=a.dataset_path, texts=a.texts,
        num_sequences=a.num_sequences, seq_len=a.seq_len, seed=a.seed,
    )
    options = AnalyzeOptions(run=a.run, steps=a.steps, inputs=inputs, batch_size=a.batch_size, out=a.out,
                             tb_dir=a.tb_dir, device=a.device, dtype=a.dtype, force=a.force)
    return 1 if RunAnalysis(options).analyze() else 0


def run_compare(argv: list[str]) -> int:
    from dispersion_titan.analysis.compare import compare

    a = compare_parser().parse_args(argv)
    print(compare(a.runs, a.out, a.step))
    print(f"written: {a.out}/compare.csv, compare_layers.csv, compare.png")
    return 0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] == "compare":
            code = run_compare(argv[1:])
        else:
            code = run_analyze(argv)
    except DispersionTitanError as e:
        fail(str(e).splitlines()[0])
    sys.exit(code)


if __name__ == "__main__":
    main()
