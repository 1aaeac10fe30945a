"""The token store: a corpus split tokenised once (``python -m dispersion_titan.data prepare``) into
shards that, concatenated, are exactly its packed token stream, read memory-mapped by training.
Each ``shard-N.bin`` gets a ``shard-N.json`` once complete; ``manifest.json``, written last, makes the
folder a finished store (docs/data.md).
"""

from __future__ import annotations

import bisect
import functools
import glob
import json
import os
from typing import Any

import numpy as np

from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder
from ..utils.errors import DataConfigError
from .corpora import DOCUMENTS_VERSION

FORMAT = "dispersion_titan.token_store"
VERSION = 1
MANIFEST = "manifest.json"
DOCUMENT_INDEX = "documents.npy"
PREPARE = "python -m dispersion_titan.data prepare"
_MAPPED_SHARDS = 64
_DTYPES = ("uint16", "uint32")
_MANIFEST_KEYS = (
    "tokenizer",
    "documents_version",
    "source",
    "dtype",
    "tokens",
    "documents",
    "shard_documents",
    "shards",
)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.bin"


def is_store(path: str | None) -> bool:
    """Whether a dataset path is a token store's folder (finished or not)."""
    folder = os.path.expanduser(path or "")
    return os.path.isdir(folder) and (
        os.path.exists(os.path.join(folder, MANIFEST)) or bool(glob.glob(os.path.join(folder, "shard-[0-9]*.bin")))
    )


def read_manifest(folder: str, field: str) -> dict[str, Any]:
    """The manifest of the store at ``folder``, else one line naming ``field`` and the file."""
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        raise DataConfigError(
            f"{field}: {path}: missing: the token store is unfinished; rerun {PREPARE} with --out {folder}"
        )
    try:
        with open(path, "rb") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataConfigError(f"{field}: {path}: corrupt manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataConfigError(f"{field}: {path}: corrupt manifest (not a {FORMAT} manifest)")
    if manifest.get("version") != VERSION:
        raise DataConfigError(
            f"{field}: {path}: format version {manifest.get('version')!r}, this code reads "
            f"{VERSION}; rebuild it with {PREPARE}"
        )
    missing = [k for k in _MANIFEST_KEYS if k not in manifest]
    if missing:
        raise DataConfigError(f"{field}: {path}: corrupt manifest (no {', '.join(missing)})")
    if not (
        isinstance(manifest["source"], dict)
        and isinstance(manifest["tokenizer"], dict)
        and isinstance(manifest["tokens"], int)
        and isinstance(manifest["shards"], list)
        and all(
            isinstance(s, dict)
            and isinstance(s.get("tokens"), int)
            and s["tokens"] >= 0
            and isinstance(s.get("file"), str)
            and os.path.basename(s["file"]) == s["file"] not in ("", ".", "..")
            for s in manifest["shards"]
        )
    ):
        raise DataConfigError(f"{field}: {path}: corrupt manifest (malformed source, tokenizer or shard list)")
    return manifest


class TokenStore:
    """A store's token stream as one read-only sequence over its shards, at most ``_MAPPED_SHARDS``
    memory-mapped at a time (each holds a file descriptor). A slice across shards is a copy."""

    def __init__(self, folder: str, manifest: dict[str, Any], dtype: np.dtype):
        self.folder = folder
        self.manifest = manifest
        self.dtype = dtype
        self.paths = [os.path.join(folder, shard["file"]) for shard in manifest["shards"]]
        self.offsets = np.cumsum([0, *(shard["tokens"] for shard in manifest["shards"])]).tolist()
        self.shard = functools.lru_cache(maxsize=_MAPPED_SHARDS)(lambda i: np.memmap(self.paths[i], dtype, mode="r"))

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, step = key.indices(len(self))
        if step != 1:
            raise ValueError("a token store is sliced with step 1")
        index = bisect.bisect_right(self.offsets, start) - 1
        pieces = []
        while start < stop:
            piece = self.shard(index)[start - self.offsets[index] : stop - self.offsets[index]]
            pieces.append(piece)
            start += len(piece)
            index += 1
        if len(pieces) == 1:
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=self.dtype)


def open_store(path: str, dataset: str, split: str, field: str, encoder: DocumentEncoder = GPT2_BPE) -> TokenStore:
    """The store at ``path`` made from ``dataset``'s ``split`` by ``encoder``, shards checked by size only."""
    folder = os.path.expanduser(path)
    manifest = read_manifest(folder, field)
    manifest_path = os.path.join(folder, MANIFEST)
    stale = None  # why its tokens differ from what ``encoder`` makes here
    made_with = manifest["tokenizer"].get("sha256")
    if made_with != encoder.fingerprint():
        stale = (
            f"made with another tokenizer (sha256 {str(made_with)[:12]}…, this run's is {encoder.fingerprint()[:12]}…)"
        )
    elif manifest["documents_version"] != DOCUMENTS_VERSION:
        stale = (
            f"made with text → documents rules version {manifest['documents_version']!r}, "
            f"this installation's is {DOCUMENTS_VERSION}"
        )
    if stale:
        raise DataConfigError(f"{field}: token store {manifest_path} is stale: {stale}; rebuild it with {PREPARE}")
    source = manifest["source"]
    if (source.get("dataset"), source.get("split")) != (dataset, split):
        raise DataConfigError(
            f"{field}: token store {manifest_path} holds {source.get('dataset')!r} {source.get('split')}, "
            f"not {dataset!r} {split}; make one with {PREPARE} {dataset} --split {split}"
        )
    if manifest["dtype"] not in _DTYPES:
        raise DataConfigError(f"{field}: {manifest_path}: corrupt manifest (dtype {manifest['dtype']!r})")
    dtype = np.dtype(manifest["dtype"])
    for shard in manifest["shards"]:
        path = os.path.join(folder, shard["file"])
        expected = shard["tokens"] * dtype.itemsize
        if not os.path.isfile(path):
            said = "not a file" if os.path.exists(path) else "missing"
            raise DataConfigError(f"{field}: {path}: {said} (listed in {manifest_path})")
        size = os.path.getsize(path)
        if size != expected:
            raise DataConfigError(
                f"{field}: {path}: {'truncated' if size < expected else 'too long'} "
                f"({size} bytes, the manifest says {expected}); repair it: rerun {PREPARE} "
                f"with --out {folder}"
            )
    if not manifest["shards"] or sum(shard["tokens"] for shard in manifest["shards"]) != manifest["tokens"]:
        raise DataConfigError(
            f"{field}: {manifest_path}: corrupt manifest (its shards do not hold its {manifest['tokens']} tokens)"
        )
    return TokenStore(folder, manifest, dtype)
