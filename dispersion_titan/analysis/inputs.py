"""The K×S token sequences every checkpoint is measured on: K seeded, aligned, non-overlapping windows
of S tokens of documents at least S long (no BOS or separator), their SHA-256 recorded with each
analysis; or, with ``protocol = "paper"``, the authors' texts (``paper_texts``), from wikitext-103-v1
or the rows of ``texts``, with the tokenizer's default special tokens.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder
from ..utils import records
from ..utils.errors import AnalysisError, DataConfigError
from ..utils.hub import quiet_datasets_bars

if TYPE_CHECKING:  # torch is imported where sequences are made: compare reads their records only
    import torch

DEFAULT_DATASET = "enwiki_sample"
SPLIT = "validation"

# The authors' load_dataset("wikitext", "wikitext-103-v1"): now the hub's Salesforce/wikitext.
PAPER_REPO = "Salesforce/wikitext"
PAPER_FILES = "wikitext-103-v1/train-*.parquet"
PAPER_MIN_WORDS, PAPER_TEXTS, PAPER_SEQ_LEN = 1024, 100, 512
_WORD = re.compile(r"\w+|[^\w\s]")  # nltk's word_tokenize, approximately: words and punctuation marks

Encode = Callable[[list[str]], list[list[int]]]
"""Texts -> token ids of each, without special tokens."""


@dataclass(frozen=True)
class InputOptions:
    """What selects the sequences; recorded in every result."""

    dataset: str | None
    dataset_path: str | None
    texts: str | None
    num_sequences: int
    seq_len: int
    seed: int
    protocol: str = "default"  # one of ANALYSIS_PROTOCOLS
    layer_points: str = "all"  # one of LAYER_POINTS


@dataclass(frozen=True)
class Sequences:
    options: InputOptions
    tokens: torch.Tensor  # [K, S] int64
    sha256: str

    def record(self) -> dict:
        """The JSON form stored in each analysis (what ``compare`` checks)."""
        return {**asdict(self.options), "tokens_sha256": self.sha256}


def read_texts(path: str) -> list[str]:
    """Texts of a jsonl file, one JSON object with a ``text`` string per line. A pipe or device is refused: it is
    read more than once (checked, then read), and an analysis records the file for the command that repeats it."""
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        raise AnalysisError(
            f"--texts: {path} is no regular file (a pipe or a device); save the texts to a file and name it"
        )
    texts = []
    try:
        with open(path, encoding="utf-8-sig") as f:  # a BOM skipped, as datasets does (data prepare, train)
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise AnalysisError(f"--texts: {path}:{number}: invalid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise AnalysisError(f'--texts: {path}:{number}: needs a "text" string field')
                texts.append(row["text"])
    except (OSError, UnicodeDecodeError) as e:
        raise AnalysisError(f"--texts: {path}: cannot be read ({e})") from None
    if not texts:
        raise AnalysisError(f"--texts: {path}: no texts")
    return texts


def _documents(options: InputOptions, encode: Encode | DocumentEncoder) -> list[np.ndarray]:
    """Token ids of every document (no separators), by a run's tokenizer or ``encode``; datasets' bars off (its
    ``Generating train split``), as ``data prepare`` reads a corpus: a failure's line alone."""
    try:
        with quiet_datasets_bars():
            if isinstance(encode, DocumentEncoder) and not options.texts:
                from ..data.packed import tokenized_documents  # TorchTitan: only for a run's own tokenizer

                return list(tokenized_documents(options.dataset, SPLIT, options.dataset_path, "--dataset", encode))
            if options.texts:
                texts = read_texts(options.texts)
            else:
                from ..data.corpora import iter_documents  # datasets: only for a registered corpus, not --texts

                texts = list(iter_documents(options.dataset, SPLIT, options.dataset_path, "--dataset"))
        ids = encode.encode_batch(texts, 8) if isinstance(encode, DocumentEncoder) else encode(texts)
        return [np.asarray(seq, dtype=np.int64) for seq in ids]
    except DataConfigError as e:
        raise AnalysisError(str(e)) from None


def paper_texts(rows: Sequence[str], count: int) -> list[str]:
    """The authors' ``get_random_long_text(random_seed=r)`` for r = 0 … count−1, on ``rows`` (their stop above
    1280 words ends the loop no sooner than its own test: 1280 > 1024)."""
    texts = []
    for seed in range(count):
        index = int(np.random.default_rng(seed).integers(0, int(len(rows) * 0.95)))
        text = ""
        while len(_WORD.findall(text)) < PAPER_MIN_WORDS:
            if index >= len(rows):
                raise AnalysisError(
                    f"--protocol paper: the corpus ends before text {seed} has "
                    f"{PAPER_MIN_WORDS} words ({len(rows)} rows)"
                )
            text += rows[index]
            index += 1
        texts.append(text)
    return texts


def paper_rows(path: str | None) -> list[str]:
    """The ``text`` column of wikitext-103-v1's train split, in the hub's row order: its parquet files under
    ``path`` (or that one file), else from the hub."""
    import pyarrow.parquet as pq

    if not path:
        from huggingface_hub import snapshot_download

        try:
            path = snapshot_download(PAPER_REPO, repo_type="dataset", allow_patterns=PAPER_FILES)
        except Exception as e:  # offline, or the hub refused
            raise AnalysisError(
                f"--protocol paper: cannot fetch {PAPER_REPO} {PAPER_FILES} ({type(e).__name__}); "
                "give a local copy with --dataset-path"
            ) from None
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(glob.glob(os.path.join(path, PAPER_FILES)) or glob.glob(os.path.join(path, "*.parquet")))
    )
    if not files:
        raise AnalysisError(f"--dataset-path: {path}: no {PAPER_FILES} (nor *.parquet) there")
    rows: list[str] = []
    for file in files:
        try:
            rows += pq.read_table(file, columns=["text"]).column("text").to_pylist()
        except Exception as e:
            raise AnalysisError(f"--dataset-path: {file}: not a parquet file with a text column ({e})") from None
    return rows


def select_sequences(options: InputOptions, encode: Encode | DocumentEncoder = GPT2_BPE) -> Sequences:
    """K seeded windows of S tokens (or the paper's K texts); a one-line ``AnalysisError`` if there are too few."""
    if options.protocol == "paper":  # the first S tokens of each paper text, with ``encode``'s special tokens
        rows = read_texts(options.texts) if options.texts else paper_rows(options.dataset_path)
        texts = paper_texts(rows, options.num_sequences)
        ids = encode.encode_batch(texts, 8) if isinstance(encode, DocumentEncoder) else encode(texts)
        if short := [i for i, seq in enumerate(ids) if len(seq) < options.seq_len]:
            raise AnalysisError(
                f"--protocol paper: text {short[0]} has only {len(ids[short[0]])} tokens, "
                f"fewer than --seq-len {options.seq_len}"
            )
        return _sequences(options, np.asarray([seq[: options.seq_len] for seq in ids], dtype=np.int64))
    found = windows(options, encode)
    if len(found) < options.num_sequences:
        raise AnalysisError(
            f"{_source(options)}: only {len(found)} windows of {options.seq_len} tokens in its texts of at least "
            f"that length; --num-sequences {options.num_sequences} needs more (lower it or --seq-len)"
        )
    rng = np.random.default_rng(options.seed)
    chosen = np.sort(rng.choice(len(found), size=options.num_sequences, replace=False))
    return _sequences(options, found[chosen])


def windows(options: InputOptions, encode: Encode | DocumentEncoder = GPT2_BPE) -> np.ndarray:
    """Every aligned non-overlapping window of S tokens of the documents at least S long, [N, S], which the K
    sequences are drawn from (the quickstart counts them before it trains); a one-line ``AnalysisError`` if none."""
    documents = _documents(options, encode)
    seq_len = options.seq_len
    found = [doc[: len(doc) // seq_len * seq_len].reshape(-1, seq_len) for doc in documents if len(doc) >= seq_len]
    if not found:
        longest = max((len(d) for d in documents), default=0)
        raise AnalysisError(
            f"{_source(options)}: none of its {len(documents)} texts has at least --seq-len {options.seq_len} "
            f"tokens (longest: {longest})"
        )
    return np.concatenate(found).astype(np.int64)


def _source(options: InputOptions) -> str:
    """Where the windows come from, as the analysis's options name it."""
    path = f" ({options.dataset_path})" if options.dataset_path else ""
    return f"--texts {options.texts}" if options.texts else f"--dataset {options.dataset}{path}, {SPLIT} split"


def _sequences(options: InputOptions, tokens: np.ndarray) -> Sequences:
    tokens = np.ascontiguousarray(tokens)
    digest = hashlib.sha256(tokens.astype("<i8").tobytes() + repr(tokens.shape).encode()).hexdigest()
    import torch

    return Sequences(options, torch.from_numpy(tokens), digest)


def located(inputs: dict, run: str | None = None) -> dict:
    """``inputs`` with the files they name (``texts``, each ``dataset_path`` entry) as real paths: one file named two
    ways (a link, ``..``) is one input. A path an earlier version recorded as typed, relative, is read from the
    current folder where it is there, else from ``run``'s folder where it is there; else kept as recorded."""

    def real(path: str) -> str:
        found = [os.path.join(base, path) for base in (os.getcwd(), run) if base and not os.path.isabs(path)]
        there = next((p for p in found if os.path.lexists(p) or glob.glob(p)), None)
        return os.path.realpath(there or path) if there or os.path.isabs(path) else path

    paths = {"texts": real(inputs["texts"])} if inputs.get("texts") else {}
    if inputs.get("dataset_path"):  # as ``arguments.absolute`` records it: comma-separated, globs kept
        paths["dataset_path"] = ",".join(real(e.strip()) for e in inputs["dataset_path"].split(",") if e.strip())
    return {**inputs, **paths}


def differences(recorded: dict, current: dict) -> str:
    """What differs between two ``Sequences.record()``s, for one-line refusals."""
    options = [{k: v for k, v in sorted(record.items()) if k != "tokens_sha256"} for record in (recorded, current)]
    return records.differences(*options) or "same options, different token sequences"
