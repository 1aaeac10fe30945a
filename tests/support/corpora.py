"""Small text corpora for the data tests: random documents, parquet files and local copies of
WikiText-103 in each layout users have."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def texts(n: int, seed: int, max_words: int = 60) -> list[str]:
    """``n`` random documents of up to ``max_words`` words, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, max_words))) for _ in range(n)]


def texts_jsonl(path: Path, documents: int, words: int, seed: int = 0) -> Path:
    """A ``--texts`` file of ``documents`` random documents of ``words`` words each."""
    rng = np.random.default_rng(seed)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS, words))}) + "\n" for _ in range(documents)))
    return path


def write_parquet(folder: Path, docs: list[str], files: int, row_group: int = 17) -> list[str]:
    """``docs`` as a ``text`` column over ``files`` parquet files, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    size = math.ceil(len(docs) / files)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(pa.table({"text": docs[i * size : (i + 1) * size]}), path, row_group_size=row_group)
        paths.append(str(path))
    return paths


# ---------------------------------------------------------------- wikitext-103 local copies (data tests)


def wikitext_article(title: str, seed: int) -> list[str]:
    """Rows of one article in WikiText's raw layout: heading, blank, paragraph lines, sections."""
    body = texts(3, seed, 25)
    return [
        "",
        f" = {title} = \n",
        "",
        f" {body[0]} \n",
        "",
        f" = = Section {seed} = = \n",
        "",
        f" {body[1]} \n",
        f" {body[2]} \n",
    ]


ARTICLES = {
    "train": [wikitext_article(f"Train article {i}", i) for i in range(6)],
    "validation": [wikitext_article(f"Held out {i}", 100 + i) for i in range(2)],
}
EXPECTED = {split: ["".join(rows).strip() for rows in arts] for split, arts in ARTICLES.items()}


def wikitext_rows(split: str) -> list[str]:
    return [row for article in ARTICLES[split] for row in article]


def wikitext_parquet_dir(root: Path) -> Path:
    """The layout of ``hf download Salesforce/wikitext``'s ``wikitext-103-raw-v1`` folder."""
    folder = root / "wikitext-103-raw-v1"
    folder.mkdir(parents=True)
    for split in ("train", "validation"):
        pq.write_table(pa.table({"text": wikitext_rows(split)}), folder / f"{split}-00000-of-00001.parquet")
    return folder


def wikitext_saved_dir(root: Path) -> Path:
    folder = root / "saved"
    datasets.DatasetDict(
        {split: datasets.Dataset.from_dict({"text": wikitext_rows(split)}) for split in ARTICLES}
    ).save_to_disk(str(folder))
    return folder


def wikitext_cache_dir(root: Path) -> Path:
    """A ``datasets`` cache holding Salesforce/wikitext: prepared from a local copy of the
    repo (README configs), then placed where datasets keeps hub datasets (owner___name)."""
    repo = root / "repo" / "wikitext"
    shutil.copytree(wikitext_parquet_dir(root / "src"), repo / "wikitext-103-raw-v1")
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: wikitext-103-raw-v1\n  data_files:\n"
        "  - split: train\n    path: wikitext-103-raw-v1/train-*\n"
        "  - split: validation\n    path: wikitext-103-raw-v1/validation-*\n---\n"
    )
    cache = root / "cache"
    datasets.load_dataset_builder(str(repo), "wikitext-103-raw-v1", cache_dir=str(cache)).download_and_prepare()
    (cache / "wikitext").rename(cache / "Salesforce___wikitext")
    return cache


# ---------------------------------------------------------------- the authors' analysis texts (--protocol paper)


def write_wikitext_copy(folder: Path, rows: int = 300) -> Path:
    """A local copy in the hub's layout of wikitext-103-v1's train split: rows of 40 words, and headings."""
    rng = np.random.default_rng(0)
    words = np.array("the of and in to a was is for on as with by at from his that it an were".split())
    lines = [
        " = Heading {} = \n".format(i) if i % 10 == 0 else " ".join(rng.choice(words, 40)) + " .\n" for i in range(rows)
    ]
    (folder / "wikitext-103-v1").mkdir(parents=True)
    for part, chunk in enumerate((lines[: rows // 2], lines[rows // 2 :])):
        pq.write_table(pa.table({"text": chunk}), folder / "wikitext-103-v1" / f"train-0000{part}-of-00002.parquet")
    return folder


def authors_long_text(rows: list[str], seed: int) -> str:
    """A transcription of the authors' get_random_long_text(min_word_count=1024, max_word_count=1280)
    (LM-Dispersion, key_observations/utils/text_data.py), with nltk's word_tokenize (not installed
    here) replaced by a count of words and punctuation marks."""
    count = lambda text: len(re.findall(r"\w+|[^\w\s]", text))  # noqa: E731
    rng = np.random.default_rng(seed=seed)
    idx = rng.integers(0, int(len(rows) * 0.95)).item()
    text = ""
    while count(text) < 1024:
        text += rows[idx]
        idx += 1
        if count(text) > 1280:
            break
    return text
