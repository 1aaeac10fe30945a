"""Tokenising documents, and token streams cached on disk (keyed by corpus identity and tokenizer) so
that ranks and later runs do not each tokenise the same corpus: the first process to take the key's
file lock writes it, the others memory-map it. ``$DISPERSION_TITAN_TOKEN_CACHE`` (``off``: none).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from filelock import FileLock

from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder
from ..utils.records import atomic_write

CACHE_ENV = "DISPERSION_TITAN_TOKEN_CACHE"
_TOKENIZE_BATCH = 256  # documents per tiktoken call (it tokenises a batch in threads)


def token_dtype(encoder: DocumentEncoder = GPT2_BPE) -> np.dtype:
    """The smallest unsigned type holding every id."""
    return np.dtype(np.uint16 if encoder.vocab_size <= 1 << 16 else np.uint32)


def tokenize(documents: Iterable[str], threads: int = 8, encoder: DocumentEncoder = GPT2_BPE) -> Iterator[np.ndarray]:
    """Each document's ids (ordinary text) followed by the end-of-sequence id, as ``token_dtype()`` arrays."""
    dtype = token_dtype(encoder)
    documents = iter(documents)
    while batch := list(itertools.islice(documents, _TOKENIZE_BATCH)):
        for ids in encoder.encode_batch(batch, threads):
            yield np.asarray([*ids, encoder.eos_id], dtype=dtype)


def cached_tokens(
    identity: dict[str, Any], build: Callable[[], np.ndarray], encoder: DocumentEncoder = GPT2_BPE
) -> np.ndarray:
    """``build()``'s tokens (made by ``encoder``), read from (or first written to) the cache."""
    folder = os.path.expanduser(os.environ.get(CACHE_ENV, ""))
    if folder.lower() == "off":
        return build()
    if not folder:
        import datasets

        folder = os.path.join(datasets.config.HF_DATASETS_CACHE, "dispersion_titan_tokens")
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        warnings.warn(f"token cache {folder} unusable ({e}); tokenising in this process")
        return build()
    key = json.dumps({**identity, "tokenizer": encoder.fingerprint()}, sort_keys=True, default=str)
    path = os.path.join(folder, f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.npy")
    if not os.path.exists(path):
        with FileLock(f"{path}.lock"):
            if not os.path.exists(path):
                tokens = build()
                with open(f"{path[:-4]}.json", "w") as f:  # what the opaque key stands for, for humans
                    json.dump({**identity, "tokenizer": encoder.name, "tokens": len(tokens)}, f, indent=1, default=str)
                atomic_write(path, lambda f: np.save(f, tokens), binary=True)
    return np.load(path, mmap_mode="r")
