"""Tokenise a corpus split once into a token store (``store``), so that training reads
token ids from disk instead of every rank tokenising the global stream.

    python -m dispersion_titan.data prepare CONFIG_OR_DATASET --out DIR [--split train|validation]
        [--dataset-path PATH] [--tokenizer FOLDER] [--workers N] [--shard-documents K]

CONFIG_OR_DATASET is a training TOML (its ``[training]`` dataset and path for
``--split train``, its ``[validation]`` ones for ``--split validation``, and the
tokenizer its ``[model]`` trains with) or a dataset name (``enwiki_sample``, ``local``,
``wikitext-103``, ``fineweb-edu``; GPT-2's BPE, or ``--tokenizer``: a Hugging Face
folder with the model's ``tokenizer.json``).

Documents are tokenised by ``--workers`` processes, one shard of ``--shard-documents`` documents
each. A rerun skips the shards whose record and bytes verify, so an interrupted prepare resumes
where it stopped (run one prepare per folder at a time).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import itertools
import json
import multiprocessing
import os
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
from ..utils.records import atomic_write, differences, flatten
from .corpora import (
    CORPORA,
    DOCUMENTS_VERSION,
    check_dataset,
    check_readable_here,
    documents_identity,
    iter_documents,
)
from .store import (
    DOCUMENT_INDEX,
    FORMAT,
    MANIFEST,
    VERSION,
    is_store,
    read_manifest,
    shard_name,
)

SHARD_DOCUMENTS = 16_384  # documents per shard (one task): ~16M tokens of FineWeb-Edu
_IN_FLIGHT_PER_WORKER = 2  # shards read ahead per worker: bounds the texts held in memory
_RECORD_KEYS = ("file", "tokens", "documents", "sha256")


def key_inputs(source: dict[str, Any], shard_documents: int, encoder: DocumentEncoder = GPT2_BPE) -> dict[str, Any]:
    """What a store's shards depend on, each recorded under its name in the manifest; their digest is the
    store's key: a rerun reuses only shards made with its key."""
    return {
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


def _record_path(out: str, index: int) -> str:
    return os.path.join(out, shard_name(index).removesuffix(".bin") + ".json")


def write_shard(out: str, index: int, texts: list[str], key: str, encoder_name: str) -> dict[str, Any]:
    """Tokenise one shard's documents and write the shard, then its record (in a worker)."""
    encoder = encoder_named(encoder_name)
    data = np.concatenate(list(encoder.tokenize(texts, threads=1))).tobytes()
    record = {
        "file": shard_name(index),
        "tokens": len(data) // encoder.dtype.itemsize,
        "documents": len(texts),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    atomic_write(os.path.join(out, record["file"]), lambda f: f.write(data), binary=True, durable=True)
    atomic_write(_record_path(out, index), lambda f: json.dump({**record, "key": key}, f), durable=True)
    return record


def verified_shard(out: str, index: int, documents: int, key: str, itemsize: int) -> dict[str, Any] | None:
    """Shard ``index``'s record if an earlier run completed it alike and its bytes match; else None."""
    try:
        record = json.loads(Path(_record_path(out, index)).read_bytes())
        path = os.path.join(out, shard_name(index))
        if (record["key"], record["documents"], record["file"]) != (key, documents, shard_name(index)):
            return None
        if os.path.getsize(path) != record["tokens"] * itemsize:
            return None
        with open(path, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != record["sha256"]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {k: record[k] for k in _RECORD_KEYS}


def _claim(out: str, inputs: dict[str, Any], key: str) -> None:
    """Create ``out`` (an OSError: ``prepare`` names it); refuse a folder holding another prepare's store or
    shards (nothing is deleted)."""
    os.makedirs(out, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise DataConfigError(f"--out: {out} is not writable")
    if os.path.exists(os.path.join(out, MANIFEST)):
        manifest = read_manifest(out, "--out")
        if manifest.get("key") != key:
            source, here = manifest["source"], flatten(json.loads(json.dumps(inputs, default=str)))
            there = differences(flatten({k: manifest.get(k) for k in inputs}), here)
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
    inputs = key_inputs(source, shard_documents, encoder)
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
    _claim(out, inputs, key)
    documents = iter(documents)
    chunks = iter(lambda: list(itertools.islice(documents, shard_documents)), [])
    records: list[dict[str, Any] | AsyncResult] = []
    waiting: collections.deque[int] = collections.deque()
    # Forked workers only tokenise and write; the pool starts before the documents are read. A Ctrl-C is
    # the parent's alone (a worker interrupted in the result queue's lock hung the pool's shutdown).
    with (
        multiprocessing.get_context("fork").Pool(workers, signal.signal, (signal.SIGINT, signal.SIG_IGN)) as pool,
        tqdm(
            desc=f"prepare {source['dataset']} {source['split']}",
            unit="tok",
            unit_scale=True,
            file=sys.stderr,
            disable=not progress,
        ) as bar,
    ):

        def settle(i: int) -> None:
            records[i] = records[i].get()
            bar.update(records[i]["tokens"])

        for index, texts in enumerate(chunks):
            done = verified_shard(out, index, len(texts), key, encoder.dtype.itemsize)
            if done:
                records.append(done)
                bar.update(done["tokens"])
                continue
            waiting.append(len(records))
            records.append(pool.apply_async(write_shard, (out, index, texts, key, encoder.name)))
            if len(waiting) > workers * _IN_FLIGHT_PER_WORKER:
                settle(waiting.popleft())
        while waiting:
            settle(waiting.popleft())
    if not records:
        raise DataConfigError(f"{source['dataset']}: no {source['split']} documents")
    return _finish(out, records, inputs, key, encoder)


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
) -> tuple[str, str | None, str, DocumentEncoder]:
    """(dataset, path, config field, encoder) named by CONFIG_OR_DATASET."""
    chosen = None if tokenizer is None else hf_tokenizer(tokenizer, "--tokenizer")
    if target in CORPORA:
        return target, dataset_path, "--dataset", chosen or GPT2_BPE
    if not (target.endswith(".toml") or os.path.isfile(target)):
        raise DataConfigError(
            f"CONFIG_OR_DATASET: {target!r} is neither a .toml file nor a dataset (choose from {sorted(CORPORA)})"
        )
    section = "training" if split == "train" else "validation"
    toml = read_toml(target, "CONFIG_OR_DATASET")
    table = toml.get(section, {})
    if not isinstance(table, dict) or not isinstance(table.get("dataset"), str):
        raise DataConfigError(f"CONFIG_OR_DATASET: {target}: [{section}] sets no dataset")
    model = toml.get("model", {})
    encoder = chosen or encoder_for(model.get("name", ""), model.get("hf_assets_path", ""))
    return table["dataset"], dataset_path or table.get("dataset_path") or None, f"{section}.dataset", encoder


def prepare(options: argparse.Namespace, sole_writer: Callable[[str], AbstractContextManager]) -> dict[str, Any]:
    """Check the source, then write (or finish) the store, as ``--out``'s ``sole_writer`` (two prepares into one
    folder at once would mix their shards); its manifest."""
    dataset, path, field, encoder = resolve_source(
        options.target, options.split, options.dataset_path, options.tokenizer
    )
    if is_store(path):
        raise DataConfigError(f"{field}_path: {path} is a token store already; name the corpus it was made from")
    check_dataset(dataset, path, field)
    check_readable_here(dataset, path, field)
    source = {
        "dataset": dataset,
        "split": options.split,
        "path": os.path.abspath(os.path.expanduser(path)) if path else None,
        "identity": documents_identity(dataset, options.split, path, field),
    }
    try:
        documents = iter_documents(dataset, options.split, path, field)  # a bad row: said before --out is made
        with sole_writer(options.out):
            return write_store(
                documents,
                options.out,
                source,
                workers=options.workers,
                shard_documents=options.shard_documents,
                encoder=encoder,
            )
    except OSError as e:  # "--out" names the culprit when the file is the store's
        if no_room(e):
            raise  # the commands' out-of-room line, exit 74
        where = str(e.filename or options.out)
        inside = os.path.abspath(where).startswith(os.path.abspath(options.out))
        raise DataConfigError(f"{'--out: ' if inside else ''}{where}: {e.strerror}") from None
