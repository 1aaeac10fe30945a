"""Token streams and the on-disk token cache: documents separated by <|endoftext|>, one
cache entry per source, built once when ranks start together."""

from __future__ import annotations

import glob
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dispersion_titan.data.corpora import DataConfigError
from dispersion_titan.data.packed import CACHE_ENV, cached_tokens, token_stream, tokenized_documents
from dispersion_titan.tokenizer.encoders import EOT_ID, gpt2_encoding
from support.corpora import texts

pytestmark = pytest.mark.usefixtures("private_caches")


def test_token_stream_is_the_documents_separated_by_endoftext(tmp_path):
    docs = texts(5, seed=4)
    pq.write_table(pa.table({"text": docs}), tmp_path / "d.parquet")
    stream = token_stream("local", "train", str(tmp_path / "d.parquet"), "training.dataset")
    tokenizer = gpt2_encoding()
    expected = [t for doc in docs for t in [*tokenizer.encode_ordinary(doc), EOT_ID]]
    assert stream.tolist() == expected
    pieces = tokenized_documents("local", "train", str(tmp_path / "d.parquet"), "training.dataset")
    assert [tokenizer.decode(p.tolist()) for p in pieces] == docs
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n')  # rows, but no document
    with pytest.raises(DataConfigError, match=r"^training\.dataset: dataset 'local' has no train documents$"):
        token_stream("local", "train", str(tmp_path / "blank.jsonl"), "training.dataset")


# ---------------------------------------------------------------- token cache


def test_token_cache_is_written_once_and_keyed_by_the_files(tmp_path, monkeypatch, capsys):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": texts(4, seed=5)}), path)
    first = token_stream("local", "train", str(path), "training.dataset")
    cached = glob.glob(str(tmp_path / "token_cache" / "*.npy"))
    assert len(cached) == 1 and isinstance(first, np.memmap)
    description = json.loads(Path(cached[0][:-4] + ".json").read_text())
    assert description["dataset"] == "local" and description["tokens"] == len(first)
    assert not glob.glob(str(tmp_path / "token_cache" / "*.tmp"), include_hidden=True)
    # A rewritten file is a new key: never a stale cache.
    pq.write_table(pa.table({"text": texts(6, seed=6)}), path)
    token_stream.cache_clear()
    second = token_stream("local", "train", str(path), "training.dataset")
    assert len(glob.glob(str(tmp_path / "token_cache" / "*.npy"))) == 2
    assert len(second) != len(first)
    # ``off``: no cache; a cache folder that cannot be made (under a file): a note, the tokens all the same.
    tokens = np.arange(3)
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cached_tokens({"dataset": "x"}, lambda: tokens) is tokens
    monkeypatch.setenv(CACHE_ENV, str(path / "cache"))
    capsys.readouterr()
    assert cached_tokens({"dataset": "x"}, lambda: tokens) is tokens
    note = rf"dispersion_titan: note: token cache {re.escape(str(path / 'cache'))} unusable \(Not a directory\); "
    assert re.fullmatch(rf"{note}tokenising in this process \({CACHE_ENV} names another\)\n", capsys.readouterr().err)
    assert len(glob.glob(str(tmp_path / "token_cache" / "*.npy"))) == 2


def test_a_cache_folder_this_process_cannot_write_is_passed_by_in_one_note(tmp_path, monkeypatch, capsys):
    """A cache folder this process may not write (another user's ``HF_HOME``; here sysfs, which not even root
    writes): each corpus tokenised all the same, one note for them all (was filelock's ``PermissionError``
    traceback from every rank, exit 1)."""
    monkeypatch.setenv(CACHE_ENV, "/sys/kernel")
    streams = []
    for seed in (7, 8):  # two corpora (as a run's train and validation splits): two keys
        pq.write_table(pa.table({"text": texts(3, seed=seed)}), tmp_path / f"{seed}.parquet")
        streams.append(token_stream("local", "train", str(tmp_path / f"{seed}.parquet"), "training.dataset"))
    monkeypatch.setenv(CACHE_ENV, "off")
    assert [s.tolist() for s in streams] == [
        token_stream.__wrapped__("local", "train", str(tmp_path / f"{seed}.parquet"), "training.dataset").tolist()
        for seed in (7, 8)
    ]
    [note] = re.findall("dispersion_titan: .*", capsys.readouterr().err)  # datasets' progress bars aside
    assert re.fullmatch(
        r"dispersion_titan: note: token cache /sys/kernel unusable \((Permission denied|Read-only file system)\); "
        rf"tokenising in this process \({CACHE_ENV} names another\)",
        note,
    )


def test_embedded_corpus_is_cached_per_split_and_reads_back_the_same_tokens(tmp_path):
    token_stream.cache_clear()
    first = {
        split: np.array(token_stream("enwiki_sample", split, None, "training.dataset"))
        for split in ("train", "validation")
    }
    descriptions = [json.loads(Path(p).read_text()) for p in glob.glob(str(tmp_path / "token_cache" / "*.json"))]
    assert sorted(d["split"] for d in descriptions) == ["train", "validation"]
    assert all(d["dataset"] == "enwiki_sample" and d["gensim"] for d in descriptions)
    token_stream.cache_clear()
    for split, tokens in first.items():
        again = token_stream("enwiki_sample", split, None, "training.dataset")
        assert isinstance(again, np.memmap) and np.array_equal(again, tokens)
    assert first["train"].size > 5 * first["validation"].size > 0


def _build_under_lock(cache: str, log: str, queue) -> None:
    """One 'rank': builds the tokens (slowly, logging that it did) unless another has."""
    import time

    os.environ[CACHE_ENV] = cache

    def build():
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)
        return np.arange(1000, dtype=np.uint16)

    queue.put(cached_tokens({"dataset": "concurrency-test"}, build).tolist())


def test_token_cache_builds_once_when_ranks_start_together(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    log = str(tmp_path / "builds.log")
    ranks = [context.Process(target=_build_under_lock, args=(str(tmp_path / "cache"), log, queue)) for _ in range(4)]
    for p in ranks:
        p.start()
    results = [queue.get(timeout=120) for _ in ranks]
    for p in ranks:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in ranks)
    assert len(Path(log).read_text().split()) == 1  # one rank tokenised, the others waited and read
    assert all(r == list(range(1000)) for r in results)
