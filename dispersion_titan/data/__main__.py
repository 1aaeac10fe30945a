"""Tokenise a corpus split once into a token store (``store``), so that training reads
token ids from disk instead of every rank tokenising the global stream.

    python -m dispersion_titan.data prepare CONFIG_OR_DATASET --out DIR [--split train|validation]
        [--dataset-path PATH] [--tokenizer FOLDER] [--workers N] [--shard-documents K]

CONFIG_OR_DATASET is a training TOML (its ``[training]`` dataset and path for
``--split train``, its ``[validation]`` ones for ``--split validation``, and the
tokenizer its ``[model]`` trains with) or a dataset name (``enwiki_sample``, ``local``,
``wikitext-103``, ``fineweb-edu``, ``fineweb-edu-1B``; GPT-2's BPE, or ``--tokenizer``: a Hugging Face
folder with the model's ``tokenizer.json``).

Documents are tokenised by ``--workers`` processes, one shard of ``--shard-documents`` documents
each. A rerun skips the shards whose record and bytes verify, so an interrupted prepare resumes
where it stopped (run one prepare per folder at a time).
"""

from __future__ import annotations

import argparse
import os
import shlex

from ..config.cli import OneLineErrorParser, named, out_folder, positive_int
from ..run_folder.outputs import remove_empty, to_make
from ..run_folder.owners import FolderOwner, refuse_unless_ours
from ..run_folder.writer_lock import sole_writer
from ..utils.errors import command, fail, run_command
from .corpora import SPLITS
from .store import SHARD_DOCUMENTS, is_store, prepare


def parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m dispersion_titan.data", description="Data tools.")
    commands = p.add_subparsers(dest="command", required=True, metavar="prepare")
    prep = commands.add_parser(
        "prepare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        help="tokenise a corpus split into a token store",
    )
    prep.add_argument("target", metavar="CONFIG_OR_DATASET", help="training TOML or dataset name")
    prep.add_argument(
        "--out", type=out_folder, required=True, help="the store's folder (created; a partial store there is resumed)"
    )
    prep.add_argument(
        "--split", choices=SPLITS, default="train", help="split (with a TOML: its section) to prepare; default train"
    )
    prep.add_argument(
        "--dataset-path",
        "--dataset_path",
        type=named("the corpus path, or leave the option out for the TOML's"),
        help="the corpus path (overrides the TOML's dataset_path)",
    )
    prep.add_argument(
        "--tokenizer",
        metavar="FOLDER",
        type=named("a Hugging Face folder holding tokenizer.json"),
        help="a Hugging Face folder whose tokenizer.json to use (default: the TOML's model's, else GPT-2's BPE)",
    )
    prep.add_argument(
        "--workers",
        type=_workers,
        default=len(os.sched_getaffinity(0)),
        help="tokenising processes (default: the CPUs this process may use)",
    )
    prep.add_argument(
        "--shard-documents",
        type=positive_int,
        default=SHARD_DOCUMENTS,
        help=f"documents per shard (default {SHARD_DOCUMENTS})",
    )
    return p


def _workers(text: str) -> int:
    """At most 8 per usable CPU: each forks the tokeniser; 100000 of them exhausted memory (exit 137)."""
    most = 8 * len(os.sched_getaffinity(0))
    if positive_int(text) > most:
        raise argparse.ArgumentTypeError(f"{text!r} is more than {most} (8 per CPU this process may use)")
    return int(text)


@command("the shards written so far are kept; the same command resumes where it stopped")
def main(argv: list[str] | None = None) -> None:
    options = parser().parse_args(argv)
    if not options.out:  # else the current folder, said as ": No such file or directory" where empty
        fail("--out: empty; name the store's folder, e.g. --out data/enwiki_sample")
    if not is_store(options.out):  # a new store's folder is nobody else's (an unfinished store is resumed)
        refuse_unless_ours(options.out, FolderOwner("token store"), "--out", "use another --out")
    made = to_make(options.out)
    try:
        manifest = prepare(options, sole_writer)
    except BaseException:
        if made:  # failed before its first write (a full disk): no empty --out a rerun would take as the store's
            remove_empty(made)
        raise
    section = "training" if options.split == "train" else "validation"
    print(
        f"token store {options.out}: {manifest['tokens']:,} tokens, {manifest['documents']:,} documents, "
        f"{len(manifest['shards'])} shards ({manifest['dtype']}); train on it with "
        f"--{section}.dataset {manifest['source']['dataset']} --{section}.dataset_path {shlex.quote(options.out)}"
    )


if __name__ == "__main__":
    run_command(main)
