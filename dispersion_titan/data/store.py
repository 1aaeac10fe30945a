"""The token store: a corpus split tokenised once (``prepare``: ``python -m dispersion_titan.data prepare``)
into shards that, concatenated, are exactly its packed token stream, read memory-mapped by training
(``open_store``) instead of every rank tokenising the global stream. Each ``shard-N.bin`` gets a
``shard-N.json`` once complete; ``manifest.json``, written last, makes the folder a finished store
(docs/data.md).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import functools
import glob
import hashlib
import itertools
import json
import multiprocessing
import os
import shlex
import signal
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..config.cli import read_toml
from ..tokenizer.encoders import GPT2_BPE, DocumentEncoder, encoder_for, encoder_named, hf_tokenizer
from ..utils.errors import DataConfigError, no_room
from ..utils.hub import quiet_datasets_bars
from ..utils.records import atomic_write, differences, flatten, holding, remove_stale_writes
from .corpora import (
    CORPORA,
    DOCUMENTS_VERSION,
    check_dataset,
    check_readable_here,
    documents_identity,
    iter_documents,
    path_field,
)

FORMAT = "dispersion_titan.token_store"
VERSION = 1
MANIFEST = "manifest.json"
DOCUMENT_INDEX = "documents.npy"
PREPARE = "python -m dispersion_titan.data prepare"
_MAPPED_SHARDS = 64
_DTYPES = ("uint16", "uint32")
_MANIFEST_TYPES = {  # every key of a manifest, and the type of its value
    "tokenizer": dict,
    "documents_version": object,
    "source": dict,
    "dtype": object,
    "tokens": int,
    "documents": object,
    "shard_documents": object,
    "shards": list,
}


def shard_name(index: int, ext: str = "bin") -> str:
    return f"shard-{index:05d}.{ext}"


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
            f"{field}: {path}: missing: the token store is unfinished; rerun {PREPARE} with --out {shlex.quote(folder)}"
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
    if missing := [k for k in _MANIFEST_TYPES if k not in manifest]:
        raise DataConfigError(f"{field}: {path}: corrupt manifest (no {', '.join(missing)})")
    if not (
        all(isinstance(manifest[k], t) for k, t in _MANIFEST_TYPES.items())
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
    memory-mapped at a time (each holds a file descriptor). A slice is a copy."""

    def __init__(self, folder: str, manifest: dict[str, Any]):
        self.folder = folder
        self.manifest = manifest
        self.dtype = dtype = np.dtype(manifest["dtype"])
        self.paths = [os.path.join(folder, shard["file"]) for shard in manifest["shards"]]
        self.offsets = np.cumsum([0, *(shard["tokens"] for shard in manifest["shards"])]).tolist()
        self.shard = functools.lru_cache(maxsize=_MAPPED_SHARDS)(lambda i: np.memmap(self.paths[i], dtype, mode="r"))

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop, _ = key.indices(len(self))  # every slice taken is contiguous
        index = bisect.bisect_right(self.offsets, start) - 1
        pieces = [np.empty(0, dtype=self.dtype)]
        while start < stop:
            pieces.append(self.shard(index)[start - self.offsets[index] : stop - self.offsets[index]])
            start += len(pieces[-1])
            index += 1
        return np.concatenate(pieces)


def open_store(path: str, dataset: str, split: str, field: str, encoder: DocumentEncoder = GPT2_BPE) -> TokenStore:
    """The store at ``path`` made from ``dataset``'s ``split`` by ``encoder``, shards checked by size only."""
    folder = os.path.expanduser(path)
    manifest = read_manifest(folder, field)
    manifest_path = os.path.join(folder, MANIFEST)
    stale = None  # why its tokens differ from what ``encoder`` makes here
    made_with, ours = manifest["tokenizer"].get("sha256"), encoder.fingerprint()
    if made_with != ours:
        stale = f"made with another tokenizer (sha256 {str(made_with)[:12]}…, this run's is {ours[:12]}…)"
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
    store = TokenStore(folder, manifest)
    for path, shard in zip(store.paths, manifest["shards"]):
        expected = shard["tokens"] * store.dtype.itemsize
        if not os.path.isfile(path):
            said = "not a file" if os.path.exists(path) else "missing"
            raise DataConfigError(f"{field}: {path}: {said} (listed in {manifest_path})")
        size = os.path.getsize(path)
        if size != expected:
            raise DataConfigError(
                f"{field}: {path}: {'truncated' if size < expected else 'too long'} "
                f"({size} bytes, the manifest says {expected}); repair it: rerun {PREPARE} "
                f"with --out {shlex.quote(folder)}"
            )
    if not manifest["shards"] or len(store) != manifest["tokens"]:
        raise DataConfigError(
            f"{field}: {manifest_path}: corrupt manifest (its shards do not hold its {manifest['tokens']} tokens)"
        )
    return store


def source_identity(dataset: str, split: str, path: str | None, field: str) -> str | None:
    """A digest of the documents ``path`` gives ``dataset``'s ``split``: a token store's as its manifest recorded
    them when it was prepared, a corpus's as they are now (``documents_identity``: its files' paths, sizes and
    times), so a store, its copy and the corpus it was made from have one; None where they cannot be read."""
    try:
        if is_store(path):
            identity = read_manifest(os.path.expanduser(path or ""), field)["source"]["identity"]
        else:
            identity = documents_identity(dataset, split, path or None, field)
    except (DataConfigError, OSError, KeyError):
        return None
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


SHARD_DOCUMENTS = 16_384  # documents per shard (one task): ~16M tokens of FineWeb-Edu
_IN_FLIGHT_PER_WORKER = 2  # shards read ahead per worker: bounds the texts held in memory
_RECORD_KEYS = ("file", "tokens", "documents", "sha256")


def write_shard(out: str, index: int, texts: list[str], key: str, encoder_name: str) -> dict[str, Any]:
    """Shard ``index``'s record: an earlier run's where it made the shard alike and the bytes match, else tokenise
    its documents and write the shard, then its record (in a worker)."""
    encoder = encoder_named(encoder_name)
    path, record_path = (os.path.join(out, shard_name(index, ext)) for ext in ("bin", "json"))
    try:
        record = json.loads(Path(record_path).read_bytes())
        alike = (record["key"], record["documents"], record["file"]) == (key, len(texts), shard_name(index))
        if alike and os.path.getsize(path) == record["tokens"] * encoder.dtype.itemsize:
            with open(path, "rb") as f:
                if hashlib.file_digest(f, "sha256").hexdigest() == record["sha256"]:
                    return {k: record[k] for k in _RECORD_KEYS}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable or another prepare's: written anew
    data = np.concatenate(list(encoder.tokenize(texts, threads=1))).tobytes()
    record = {
        "file": shard_name(index),
        "tokens": len(data) // encoder.dtype.itemsize,
        "documents": len(texts),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    atomic_write(path, lambda f: f.write(data), binary=True, durable=True)
    atomic_write(record_path, lambda f: json.dump({**record, "key": key}, f), durable=True)
    return record


def _differences_once(old: dict, new: dict) -> str:
    """``differences``, less a ``source.identity.K`` that repeats ``source.K`` (the split is in both)."""

    def repeats(key: str) -> bool:
        plain = key.replace(".identity.", ".", 1)
        return plain != key and (old.get(key), new.get(key)) == (old.get(plain), new.get(plain))

    return differences(*({k: v for k, v in d.items() if not repeats(k)} for d in (old, new)))


def _claim(out: str, inputs: dict[str, Any], key: str) -> None:
    """Create ``out`` (an OSError: ``prepare`` names it); refuse a folder holding another prepare's store or
    shards (nothing is deleted)."""
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, MANIFEST)):
        manifest = read_manifest(out, "--out")
        if manifest.get("key") != key:
            source, here = manifest["source"], flatten(json.loads(json.dumps(inputs, default=str)))
            there = _differences_once(flatten({k: manifest.get(k) for k in inputs}), here)
            raise DataConfigError(
                f"--out: {out} holds a token store of {source.get('dataset')!r} "
                f"{source.get('split')} made from other inputs (there vs here: {there}); choose another folder"
            )
    for path in sorted(Path(out).glob("shard-*.json")):
        try:
            found = json.loads(path.read_bytes()).get("key")
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: that shard is rewritten
        if found != key:
            raise DataConfigError(
                f"--out: {path} belongs to a prepare from other inputs "
                "(source, tokenizer or --shard-documents); choose another folder"
            )
    remove_stale_writes(out)  # half-written files of a prepare that died mid-write (this one holds --out alone)


def write_store(
    documents: Iterable[str],
    out: str,
    source: dict[str, Any],
    *,
    workers: int,
    shard_documents: int = SHARD_DOCUMENTS,
    progress: bool = True,
    encoder: DocumentEncoder = GPT2_BPE,
) -> dict[str, Any]:
    """Tokenise ``documents`` (described by ``source``) into the store at ``out``; its manifest."""
    inputs = {  # what its shards depend on, each recorded under its name in the manifest; their digest is its key
        "format": FORMAT,
        "version": VERSION,
        "source": source,
        "tokenizer": {  # what the token ids depend on
            "name": encoder.name,
            "sha256": encoder.fingerprint(),
            "n_vocab": encoder.vocab_size,
            "special_tokens": {encoder.eos_token: encoder.eos_id},
        },
        "documents_version": DOCUMENTS_VERSION,
        "dtype": encoder.dtype.name,
        "shard_documents": shard_documents,
    }
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
    _claim(out, inputs, key)
    documents = iter(documents)
    chunks = iter(lambda: list(itertools.islice(documents, shard_documents)), [])
    records: list[dict[str, Any]] = []
    waiting: collections.deque[AsyncResult] = collections.deque()
    # Forked workers only verify, tokenise and write; the pool starts before the documents are read.
    with (
        multiprocessing.get_context("fork").Pool(workers, _parents_to_stop) as pool,
        tqdm(
            desc=f"prepare {source['dataset']} {source['split']}",
            unit="tok",
            unit_scale=True,
            file=sys.stderr,
            disable=not progress,
        ) as bar,
    ):

        def settle() -> None:
            records.append(waiting.popleft().get())
            bar.update(records[-1]["tokens"])

        try:
            for index, texts in enumerate(chunks):
                waiting.append(pool.apply_async(write_shard, (out, index, texts, key, encoder.name)))
                if len(waiting) > workers * _IN_FLIGHT_PER_WORKER:
                    settle()
            while waiting:
                settle()
        except Exception:  # a shard failed (a full disk): the shards in flight are finished and kept, not cut off
            pool.close()
            pool.join()
            raise
    return _finish(out, records, inputs, key, encoder)


def _parents_to_stop() -> None:
    """A pool worker stops when its parent stops the pool (SIGTERM, the default action again: not the command's
    handler), never on its own: in a process group of its own, so that Ctrl-C and a SIGTERM to the command's
    group (Slurm's scancel) reach the parent alone, and ignoring a SIGINT sent to it. A worker killed in the pool's
    task queue lock, or interrupted there, hung the parent's shutdown of the pool."""
    os.setpgid(0, 0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _finish(
    out: str, records: list[dict[str, Any]], inputs: dict[str, Any], key: str, encoder: DocumentEncoder
) -> dict[str, Any]:
    """Write the document index (from the separators in the shards), then the manifest."""
    dtype, starts, offset = encoder.dtype, [], 0
    for record in records:
        shard = np.memmap(os.path.join(out, record["file"]), dtype=dtype, mode="r")
        ends = np.flatnonzero(shard == encoder.eos_id) + offset + 1
        starts.append(np.concatenate([[offset], ends[:-1]]).astype(np.int64))
        offset += len(shard)
    atomic_write(
        os.path.join(out, DOCUMENT_INDEX), lambda f: np.save(f, np.concatenate(starts)), binary=True, durable=True
    )
    manifest = {
        **inputs,
        "key": key,
        "tokens": offset,
        "documents": sum(r["documents"] for r in records),
        "document_index": DOCUMENT_INDEX,
        "shards": records,
    }
    atomic_write(os.path.join(out, MANIFEST), lambda f: f.write(json.dumps(manifest, indent=1) + "\n"), durable=True)
    return manifest


def resolve_source(
    target: str, split: str, dataset_path: str | None, tokenizer: str | None
) -> tuple[str, str | None, str, str, DocumentEncoder]:
    """(dataset, path, config field, the path's option, encoder) named by CONFIG_OR_DATASET and --dataset-path."""
    chosen = None if tokenizer is None else hf_tokenizer(tokenizer, "--tokenizer")
    if target in CORPORA:
        return target, dataset_path, "--dataset", path_field("--dataset"), chosen or GPT2_BPE
    if not (target.endswith(".toml") or os.path.isfile(target)):
        raise DataConfigError(
            f"CONFIG_OR_DATASET: {target!r} is neither a .toml file nor a dataset (choose from {sorted(CORPORA)})"
        )
    section = "training" if split == "train" else "validation"
    toml = read_toml(target, "CONFIG_OR_DATASET")
    table = toml.get(section, {})
    if not isinstance(table, dict) or not isinstance(table.get("dataset"), str):
        raise DataConfigError(f"CONFIG_OR_DATASET: {target}: [{section}] sets no dataset")
    if not isinstance(model := toml.get("model", {}), dict):  # was an AttributeError traceback
        raise DataConfigError(f"CONFIG_OR_DATASET: {target}: [model] is no table")
    encoder = chosen or encoder_for(model.get("name", ""), model.get("hf_assets_path", ""))
    field = f"{section}.dataset"
    path_from = path_field("--dataset") if dataset_path else path_field(field)
    return table["dataset"], dataset_path or table.get("dataset_path") or None, field, path_from, encoder


def prepare(options: argparse.Namespace, sole_writer: Callable[[str], AbstractContextManager]) -> dict[str, Any]:
    """Check the source, then write (or finish) the store, as ``--out``'s ``sole_writer`` (two prepares into one
    folder at once would mix their shards); its manifest."""
    dataset, path, field, path_from, encoder = resolve_source(
        options.target, options.split, options.dataset_path, options.tokenizer
    )
    if is_store(path):
        raise DataConfigError(f"{path_from}: {path} is a token store already; name the corpus it was made from")
    check_dataset(dataset, path, field, path_from)
    check_readable_here(dataset, path, field, path_from)
    source = {
        "dataset": dataset,
        "split": options.split,
        "path": os.path.abspath(os.path.expanduser(path)) if path else None,
        "identity": documents_identity(dataset, options.split, path, field, path_from),
    }
    lock = None
    try:
        with quiet_datasets_bars():  # a bad row: said before --out is made, its one line alone
            documents = iter_documents(dataset, options.split, path, field, path_from)
            first = next(documents, None)  # and a corpus without text
        if first is None:
            where = f" {path}" if path else ""
            raise DataConfigError(f"{dataset}{where}: no {options.split} documents (no row with text)")
        with sole_writer(options.out) as lock, holding(lock):  # forked with the pool: its writes too
            return write_store(
                itertools.chain([first], documents),
                options.out,
                source,
                workers=options.workers,
                shard_documents=options.shard_documents,
                encoder=encoder,
            )
    except OSError as e:  # "--out" names the culprit when the file is the store's
        if no_room(e) or (lock is not None and e.filename == os.fspath(lock.path)):
            raise  # the commands' out-of-room line, or --out removed or replaced meanwhile (``holding``): exit 74
        where = str(e.filename or options.out)
        inside = os.path.abspath(where).startswith(os.path.abspath(options.out))
        raise DataConfigError(f"{'--out: ' if inside else ''}{where}: {e.strerror}") from None
