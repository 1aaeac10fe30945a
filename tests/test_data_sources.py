"""Corpora and their sources: WikiText local copies in every form, local jsonl / txt / parquet
files, and errors that name the field or the hub override."""

from __future__ import annotations

import codecs
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dispersion_titan.data import corpora
from dispersion_titan.data.corpora import DataConfigError, iter_documents, wikitext_articles
from support.corpora import (
    ARTICLES,
    EXPECTED,
    texts,
    wikitext_cache_dir,
    wikitext_parquet_dir,
    wikitext_rows,
    wikitext_saved_dir,
)

pytestmark = pytest.mark.usefixtures("private_caches")


def test_wikitext_rows_become_articles():
    rows = wikitext_rows("train")
    assert list(wikitext_articles(rows)) == EXPECTED["train"]
    assert all(doc.startswith("= Train article") and "= = Section" in doc for doc in EXPECTED["train"])


@pytest.mark.parametrize("form", ["saved", "parquet_dir", "cache", "files"])
def test_wikitext_local_copy_forms(tmp_path, form):
    if form == "saved":
        paths = dict.fromkeys(ARTICLES, str(wikitext_saved_dir(tmp_path)))
    elif form == "parquet_dir":
        paths = dict.fromkeys(ARTICLES, str(wikitext_parquet_dir(tmp_path)))
    elif form == "cache":
        paths = dict.fromkeys(ARTICLES, str(wikitext_cache_dir(tmp_path)))
    else:
        folder = wikitext_parquet_dir(tmp_path)
        paths = {split: str(folder / f"{split}-*.parquet") for split in ARTICLES}
    if form != "files":  # a folder's cache identity: every file in it
        files = sorted(str(p) for p in Path(paths["train"]).rglob("*") if p.is_file())
        identity = corpora.documents_identity("wikitext-103", "train", paths["train"], "validation.dataset")
        assert [f for f, _, _ in identity["source"]] == files
    for split in ARTICLES:
        corpora.check_dataset("wikitext-103", paths[split], "validation.dataset")
        assert list(iter_documents("wikitext-103", split, paths[split], "validation.dataset")) == EXPECTED[split]
    if form == "cache":  # a cache of another config only: named in one line
        cached = Path(paths["train"]) / "Salesforce___wikitext"
        (cached / "wikitext-103-raw-v1").rename(cached / "wikitext-2-raw-v1")
        with pytest.raises(DataConfigError, match=r"^validation\.dataset_path: .*: Couldn't find cache for Sales"):
            next(iter_documents("wikitext-103", "train", paths["train"], "validation.dataset"))


def test_wikitext_copy_without_the_split_names_the_field(tmp_path):
    folder = tmp_path / "only_train"
    folder.mkdir()
    pq.write_table(pa.table({"text": wikitext_rows("train")}), folder / "train-00000-of-00001.parquet")
    with pytest.raises(DataConfigError, match=r"^validation\.dataset_path: .* has no 'validation' split"):
        list(iter_documents("wikitext-103", "validation", str(folder), "validation.dataset"))


def test_unreachable_hub_error_names_the_override(tmp_path):
    """Offline (HF_HUB_OFFLINE=1): loading fails with one line naming the path option."""
    code = (
        "from dispersion_titan.data.corpora import DataConfigError, iter_documents\n"
        "try:\n    next(iter_documents('wikitext-103', 'train', None, 'training.dataset'))\n"
        "except DataConfigError as e:\n    print(e)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("training.dataset_path: cannot reach the Hugging Face hub for Salesforce/wikitext")
    assert "set training.dataset_path to a local copy" in lines[0]


def test_a_hub_nothing_answers_at_is_one_line_at_once(monkeypatch, caplog):
    """Not offline, but no hub reachable: the same one line within the probe's seconds (was 25 s of retries, and
    huggingface_hub's ``'[Errno -2] Name or service not known' thrown while requesting HEAD ...`` line above it)."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(DataConfigError) as error:
        next(iter_documents("wikitext-103", "train", None, "training.dataset"))
    assert str(error.value).startswith(
        "training.dataset_path: cannot reach the Hugging Face hub for Salesforce/wikitext (wikitext-103-raw-v1): "
        "127.0.0.1:9 is unreachable from here (Connection refused); set training.dataset_path to a local copy"
    )
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------- local files


def test_local_jsonl_txt_parquet_in_order(tmp_path):
    docs = texts(7, seed=3)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(docs[:3])))
    (tmp_path / "b.txt").write_text(docs[3])
    pq.write_table(pa.table({"text": docs[4:]}), tmp_path / "c.parquet")
    spec = f"{tmp_path}/a.jsonl,{tmp_path}/b.txt,{tmp_path}/*.parquet"
    assert list(iter_documents("local", "train", spec, "training.dataset")) == docs


def test_txt_saved_with_a_bom_gives_the_documents_it_gives_without(tmp_path):
    """A .txt saved "UTF-8 with BOM" (a Windows editor's choice), one file of a path or a local copy's in a folder:
    its documents are those without it, as jsonl's are (was: U+FEFF kept at the start of the first document)."""
    doc = texts(1, seed=5)[0]
    copy = "\n".join(row.rstrip("\n") for row in wikitext_rows("validation")).encode()
    read = []
    for bom in (b"", codecs.BOM_UTF8):
        folder = tmp_path / f"bom-{len(bom)}"
        (folder / "copy").mkdir(parents=True)
        (folder / "doc.txt").write_bytes(bom + doc.encode())
        (folder / "copy" / "validation.txt").write_bytes(bom + copy)
        local = list(iter_documents("local", "train", str(folder / "doc.txt"), "training.dataset"))
        read.append((local, list(iter_documents("wikitext-103", "validation", str(folder / "copy"), "--dataset"))))
    assert read[0][0] == [doc] and read[0][1][0].startswith("= Held out 0 =")
    assert read[1] == read[0]


def test_local_file_without_text_field_names_it(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"body": "no text field"}\n')
    with pytest.raises(DataConfigError, match=r"^training\.dataset_path: .*x\.jsonl.* has no 'text' column"):
        list(iter_documents("local", "train", str(tmp_path / "x.jsonl"), "training.dataset"))
