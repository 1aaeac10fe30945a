"""Tokenising documents, and token streams cached on disk so that 8+ ranks (and later
runs) do not each spend minutes tokenising the same corpus.

The cache file is keyed by the corpus identity (dataset, split, source files with their
sizes and mtimes, or the hub id) and the tokenizer's fingerprint (``bpe``). The first process to
take the key's file lock tokenises and writes ``<key>.npy`` atomically (temporary file +
rename); the others wait for the lock, then memory-map the result, so ranks on one node
share one copy in the page cache. The directory is ``$DISPERSION_TITAN_TOKEN_CACHE`` or
``<datasets cache>/dispersion_titan_tokens``; set the variable to ``off`` to tokenise in
every process instead (also the fallback when the directory is not writable).
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

from ..bpe import EOT_ID, gpt2_encoding, tokenizer_fingerprint

CACHE_ENV = "DISPERSION_TITAN_TOKEN_CACHE"
_TOKENIZE_BATCH = 256  # documents per tiktoken call (it tokenises a batch in threads)


def token_dtype() -> np.dtype:
    """The smallest unsigned type holding every id: uint16 for GPT-2's 50257."""
    return np.dtype(np.uint16 if gpt2_encoding().n_vocab <= 1 << 16 else np.uint32)


def tokenize(documents: Iterable[str], threads: int = 8) -> Iterator[np.ndarray]:
    """Each document's GPT-2 ids (``encode_ordinary``) followed by ``<|endoftext|>``, as
    ``token_dtype()`` arrays. ``threads``: tiktoken's threads per batch."""
    encoding, dtype = gpt2_encoding(), token_dtype()
    documents = iter(documents)
    while batch := list(itertools.islice(documents, _TOKENIZE_BATCH)):
        for ids in encoding.encode_ordinary_batch(batch, num_threads=threads):
            yield np.asarray([*ids, EOT_ID], dtype=dtype)


def cache_dir() -> str | None:
    configured = os.environ.get(CACHE_ENV)
    if configured and configured.lower() == "off":
        return None
    if configured:
        return os.path.expanduser(configured)
    import datasets

    return os.path.join(datasets.config.HF_DATASETS_CACHE, "dispersion_titan_tokens")


def cache_key(identity: dict[str, Any]) -> str:
    text = json.dumps({**identity, "tokenizer": tokenizer_fingerprint()}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_tokens(identity: dict[str, Any] | None, build: Callable[[], np.ndarray]) -> np.ndarray:
    """``build()``'s uint16 tokens, read from (or first written to) the cache."""
    folder = cache_dir()
    if identity is None or folder is None:
        return build()
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        warnings.warn(f"token cache {folder} unusable ({e}); tokenising in this process")
        return build()
    path = os.path.join(folder, f"{cache_key(identity)}.npy")
    if not os.path.exists(path):
        with FileLock(f"{path}.lock"):
            if not os.path.exists(path):
                _write_atomically(path, build(), identity)
    return np.load(path, mmap_mode="r")


def _write_atomically(path: str, tokens: np.ndarray, identity: dict[str, Any]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        np.save(f, tokens)
    with open(f"{path[:-4]}.json", "w") as f:  # what the opaque key stands for, for humans
        json.dump({**identity, "tokens": int(len(tokens))}, f, indent=1, default=str)
    os.replace(tmp, path)
