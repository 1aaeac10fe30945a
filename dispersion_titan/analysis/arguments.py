"""``analyze``'s input options checked and made its ``InputOptions``, without torch: ``paper --slurm`` compares
its analyze jobs' with the analyses already in their folders before it submits them."""

from __future__ import annotations

import argparse
import os

from ..data.corpora import corpus
from ..utils.devices import check_device_map
from ..utils.errors import ArgumentError
from ..utils.hub import PREFIX
from .inputs import DEFAULT_DATASET, InputOptions, read_texts

DEFAULT_SEQ_LEN = 512


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
