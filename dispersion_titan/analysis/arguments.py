"""``analyze``'s input options (``paper``'s too) checked and made its ``InputOptions``, without torch: ``paper
--slurm`` compares its analyze jobs' with the analyses already in their folders before it submits them."""

from __future__ import annotations

import argparse
import os

from ..config.cli import named, non_negative_int, positive_int
from ..data.corpora import corpus
from ..utils.devices import check_device_map
from ..utils.errors import ArgumentError
from ..utils.hub import PREFIX
from .inputs import DEFAULT_DATASET, InputOptions, read_texts

DEFAULT_SEQ_LEN = 512


def _seq_len(text: str) -> int:
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 2 (pairs of tokens are measured)")
    return int(text)


def add_input_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, defaults: bool = True) -> None:
    """The options that choose analyze's input sequences; ``paper`` passes them on (no ``defaults``: unset)."""
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--dataset",
        type=named("a registered dataset"),
        help="registered dataset whose validation split is used (default: enwiki_sample)",
    )
    source.add_argument(
        "--texts", type=named("a jsonl file"), metavar="FILE", help='jsonl file with a "text" field per line'
    )
    p.add_argument(
        "--dataset-path",
        "--dataset_path",
        type=named("the dataset's files"),
        help="files for --dataset local; with --protocol paper, a local copy of wikitext-103-v1 "
        "(a folder with wikitext-103-v1/train-*.parquet, or one .parquet file)",
    )
    p.add_argument(
        "--num-sequences", type=positive_int, default=100 if defaults else None, help="K sequences (default 100)"
    )
    p.add_argument(
        "--seq-len", type=_seq_len, help="S tokens per sequence (default 512, or the model's positions if fewer)"
    )
    p.add_argument(
        "--seed", type=non_negative_int, default=0 if defaults else None, help="seed of the sequence choice (default 0)"
    )


def input_options(a: argparse.Namespace) -> InputOptions:
    """``analyze``'s inputs, its options' combinations checked; ``--texts`` read before any folder is made."""
    hf, paper = a.run.startswith(PREFIX), a.protocol == "paper"
    if a.dataset_path and a.texts:
        raise ArgumentError("--dataset-path: not used with --texts")
    if paper and a.dataset:
        raise ArgumentError(
            "--dataset: not used with --protocol paper, which reads wikitext-103-v1 (a local copy with "
            "--dataset-path) or the rows of --texts FILE"
        )
    if hf and a.wandb:
        raise ArgumentError("--wandb: only for runs (trained with [metrics] enable_wandb)")
    if not hf and (a.device_map or a.trust_remote_code):
        raise ArgumentError(f"--{'device-map' if a.device_map else 'trust-remote-code'}: only for hf: models")
    check_device_map(a.device_map, a.device)
    if a.texts:
        read_texts(a.texts)
    dataset = None if a.texts or paper else (a.dataset or DEFAULT_DATASET)
    if dataset:  # was: a path the embedded corpus ignores taken as other settings
        corpus(dataset, "--dataset").check_path(a.dataset_path, "--dataset-path")
    return InputOptions(
        dataset=dataset,
        dataset_path=absolute(a.dataset_path),
        texts=a.texts and os.path.abspath(os.path.expanduser(a.texts)),  # one file, a comma in its name kept
        num_sequences=a.num_sequences,
        seq_len=a.seq_len or DEFAULT_SEQ_LEN,
        seed=a.seed,
        protocol=a.protocol,
        layer_points=a.layer_points or ("hidden_states" if paper else "all"),
    )


def absolute(spec: str | None, folder: str = "") -> str | None:
    """``spec``'s paths (comma-separated, globs kept) made absolute, relative ones from ``folder``: the analysis
    records them, ``compare`` and ``family`` compare them, and measuring again names the same files from any folder."""
    entries = spec and [os.path.join(folder, os.path.expanduser(e.strip())) for e in spec.split(",") if e.strip()]
    return ",".join(map(os.path.abspath, entries)) if entries else spec
