"""The K×S token sequences every checkpoint is measured on.

Each sequence is an aligned, non-overlapping window of exactly S tokens cut from a
document at least S tokens long (no BOS or separator is added, as in GPT-2 and the
paper). The validation slice of the embedded corpus has only ten articles, so one
document gives several windows. K windows are drawn from all of them with a seeded
generator, so the same options give the same sequences for every checkpoint and run;
their SHA-256 is recorded with each analysis, and ``compare`` refuses to set side by
side analyses whose sequences differ.

The same texts and windowing serve every tokenizer: a run's (``encoders``: GPT-2's BPE,
the default, or the model's own; read from the token cache for corpora), or a Hugging
Face model's own tokenizer passed as ``encode`` (no special tokens added either way).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..tokenizer.encoders import GPT2, DocumentEncoder
from ..utils.errors import DataConfigError
from . import AnalysisError

DEFAULT_DATASET = "enwiki_sample"
SPLIT = "validation"

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

    def describe(self) -> str:
        if self.texts:
            return f"--texts {self.texts}"
        path = f" ({self.dataset_path})" if self.dataset_path else ""
        return f"--dataset {self.dataset}{path}, {SPLIT} split"


@dataclass(frozen=True)
class Sequences:
    options: InputOptions
    tokens: torch.Tensor  # [K, S] int64
    sha256: str

    def record(self) -> dict:
        """The JSON form stored in each analysis (what ``compare`` checks)."""
        return {**asdict(self.options), "tokens_sha256": self.sha256}


def read_texts(path: str) -> list[str]:
    """Texts of a jsonl file, one JSON object with a ``text`` string per line."""
    texts = []
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise AnalysisError(f"--texts: {path}:{number}: invalid JSON ({e.msg})") from None
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise AnalysisError(f"--texts: {path}:{number}: needs a \"text\" string field")
                texts.append(row["text"])
    except (OSError, UnicodeDecodeError) as e:
        raise AnalysisError(f"--texts: {path}: cannot be read ({e})") from None
    if not texts:
        raise AnalysisError(f"--texts: {path}: no texts")
    return texts


def _texts(options: InputOptions) -> list[str]:
    if options.texts:
        return read_texts(options.texts)
    from ..data.corpora import iter_documents

    return list(iter_documents(options.dataset, SPLIT, options.dataset_path, "--dataset"))


def _documents(options: InputOptions, encode: Encode | DocumentEncoder) -> list[np.ndarray]:
    """Token ids of every document (no separators), by a run's tokenizer or ``encode``."""
    try:
        if not isinstance(encode, DocumentEncoder):
            return [np.asarray(ids, dtype=np.int64) for ids in encode(_texts(options))]
        if options.texts:
            return [np.asarray(ids) for ids in encode.encode_batch(read_texts(options.texts), 8)]
        from ..data.packed import tokenized_documents

        return list(tokenized_documents(options.dataset, SPLIT, options.dataset_path, "--dataset", encode))
    except DataConfigError as e:
        raise AnalysisError(str(e)) from None


def _windows(documents: list[np.ndarray], seq_len: int) -> np.ndarray:
    """All aligned non-overlapping windows of ``seq_len`` tokens, [N, S]."""
    windows = [
        doc[: len(doc) // seq_len * seq_len].reshape(-1, seq_len)
        for doc in documents
        if len(doc) >= seq_len
    ]
    return np.concatenate(windows).astype(np.int64) if windows else np.empty((0, seq_len), np.int64)


def select_sequences(options: InputOptions, encode: Encode | DocumentEncoder = GPT2) -> Sequences:
    """K seeded windows of S tokens; a one-line ``AnalysisError`` if there are too few."""
    documents = _documents(options, encode)
    windows = _windows(documents, options.seq_len)
    source = options.describe()
    if len(windows) == 0:
        longest = max((len(d) for d in documents), default=0)
        raise AnalysisError(
            f"{source}: none of its {len(documents)} texts has at least --seq-len {options.seq_len} "
            f"tokens (longest: {longest})"
        )
    if len(windows) < options.num_sequences:
        raise AnalysisError(
            f"{source}: only {len(windows)} windows of {options.seq_len} tokens in its texts of at least "
            f"that length; --num-sequences {options.num_sequences} needs more (lower it or --seq-len)"
        )
    rng = np.random.default_rng(options.seed)
    chosen = np.sort(rng.choice(len(windows), size=options.num_sequences, replace=False))
    tokens = np.ascontiguousarray(windows[chosen])
    digest = hashlib.sha256(tokens.astype("<i8").tobytes() + repr(tokens.shape).encode()).hexdigest()
    return Sequences(options, torch.from_numpy(tokens), digest)


def differences(recorded: dict, current: dict) -> str:
    """What differs between two ``Sequences.record()``s, for one-line refusals."""
    changed = [
        f"{key} {recorded.get(key)!r} vs {current.get(key)!r}"
        for key in sorted(set(recorded) | set(current))
        if key != "tokens_sha256" and recorded.get(key) != current.get(key)
    ]
    return ", ".join(changed) or "same options, different token sequences"
