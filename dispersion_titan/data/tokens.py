"""Tokenising documents, and token streams cached on disk so that 8+ ranks (and later
runs) do not each spend minutes tokenising the same corpus.

The cache file is keyed by the corpus identity (dataset, split, source files with their
sizes and mtimes, or the hub id) and the tokenizer files' SHA-256. The first process to
take the key's file lock tokenises and writes ``<key>.npy`` atomically (temporary file +
rename); the others wait for the lock, then memory-map the result, so ranks on one node
share one copy in the page cache. The directory is ``$DISPERSION_TITAN_TOKEN_CACHE`` or
``<datasets cache>/dispersion_titan_tokens``; set the variable to ``off`` to tokenise in
every process instead (also the fallback when the directory is not writable).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from filelock import FileLock

from ..tokenizer import EOT_ID, GPT2Tokenizer, bpe_files

CACHE_ENV = "DISPERSION_TITAN_TOKEN_CACHE"
_TOKENIZE_BATCH = 256  # documents per tiktoken call (it tokenises a batch in threads)


def tokenize(documents: Iterable[str]) -> Iterator[np.ndarray]:
    """Each document's GPT-2 ids followed by ``<|endoftext|>``, as uint16 arrays."""
    tokenizer = GPT2Tokenizer()
    documents = iter(documents)
    while batch := list(itertools.islice(documents, _TOKENIZE_BATCH)):
        for ids in tokenizer.encode_batch(batch):
            yield np.asarray([*ids, EOT_ID], dtype=np.uint16)


def cache_dir() -> str | None:
    configured = os.environ.get(CACHE_ENV)
    if configured and configured.lower() == "off":
        return None
    if configured:
        return os.path.expanduser(configured)
    import datasets

    return os.path.join(datasets.config.HF_DATASETS_CACHE, "dispersion_titan_tokens")


@functools.cache
def tokenizer_fingerprint() -> str:
    digest = hashlib.sha256()
    for path in bpe_files():
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


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
