"""Named document sources (``[training] dataset`` / ``[validation] dataset``, ``CORPORA``); hub datasets
accept a local copy as ``<section>.dataset_path`` (``sources``). docs/data.md describes each.
"""

from __future__ import annotations

import bz2
import functools
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import datasets

from ..utils.errors import DataConfigError
from ..utils.package_data import package_file
from .sources import (
    cache_folder_name,
    file_identity,
    file_texts,
    iter_text,
    load_rows,
    resolve_local_files,
    source_files,
)

SPLITS = ("train", "validation")
ENWIKI_VALIDATION_EVERY = 10  # every 10th article is held out: a deterministic ~10% slice
FINEWEB_VALIDATION_DOCUMENTS = 10_000
# Part of every token-cache key: bump it when the text → documents rules change.
DOCUMENTS_VERSION = 1


_WIKITEXT_ARTICLE_TITLE = re.compile(r"^ = [^=].* = \n?$")


def wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """WikiText rows are lines; an article starts at each top-level `` = Title = `` line
    (sections are `` = = Section = = ``), as in EleutherAI's document-level WikiText."""
    article: list[str] = []
    for line in lines:
        if _WIKITEXT_ARTICLE_TITLE.match(line) and "".join(article).strip():
            yield "".join(article).strip()
            article = []
        article.append(line)
    if "".join(article).strip():
        yield "".join(article).strip()


class Corpus(ABC):
    """A named source of plain-text documents; ``path_field`` names the path option for errors."""

    streams_training = False  # the train split is streamed, never held in memory

    @abstractmethod
    def documents(self, split: str, path: str | None, path_field: str) -> Iterator[str]:
        """The documents of ``split`` in their fixed order."""

    def check_path(self, path: str | None, path_field: str) -> None:
        """Offline, cheap pre-launch check of the configured path, true on any machine."""

    def check_here(self, path: str | None, path_field: str) -> None:
        """That this machine can read the corpus (a plan for another machine does not ask)."""

    @abstractmethod
    def identity(self, split: str, path: str | None, path_field: str) -> dict[str, Any]:
        """What the tokens of ``split`` depend on (the token-cache key)."""


class EmbeddedWikipedia(Corpus):
    def documents(self, split: str, path: str | None, path_field: str) -> Iterator[str]:
        del path, path_field  # embedded: nothing to override (check_path refuses one)
        for i, article in enumerate(_enwiki_articles()):
            held_out = i % ENWIKI_VALIDATION_EVERY == ENWIKI_VALIDATION_EVERY - 1
            if held_out == (split == "validation"):
                yield article

    def check_path(self, path: str | None, path_field: str) -> None:
        if path:
            raise DataConfigError(
                f"{path_field}: 'enwiki_sample' is embedded and takes no path (did you mean 'local'?)"
            )

    def identity(self, split: str, path: str | None, path_field: str) -> dict[str, Any]:
        """Cached: stripping the markup takes gensim about 5 s per process."""
        del split, path, path_field
        return {"files": [file_identity(enwiki_sample_path())], "gensim": version("gensim")}


def enwiki_sample_path() -> str:
    """The dump inside gensim's wheel (located without importing gensim)."""
    return package_file(
        "gensim", "test", "test_data", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    )


@functools.cache
def _enwiki_articles() -> tuple[str, ...]:
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    articles = []
    with bz2.open(enwiki_sample_path(), "rb") as dump:
        for _title, text, _pageid in extract_pages(dump):
            if not text or text.lstrip().lower().startswith("#redirect"):
                continue
            # filter_wiki drops templates, links and tags; bold/italic quote runs remain.
            plain = filter_wiki(text).replace("'''", "").replace("''", "")
            paragraphs = (line.strip() for line in plain.splitlines())
            articles.append("\n".join(p for p in paragraphs if p))
    return tuple(articles)


class LocalFiles(Corpus):
    """jsonl/parquet rows (``text`` field) or txt files (one document each), per split."""

    def documents(self, split: str, path: str | None, path_field: str) -> Iterator[str]:
        del split
        return filter(None, file_texts(resolve_local_files(path or "", path_field), path_field))

    def check_path(self, path: str | None, path_field: str) -> None:
        resolve_local_files(path or "", path_field)

    def identity(self, split: str, path: str | None, path_field: str) -> dict[str, Any]:
        return {"files": source_files(path or "", path_field)}


@dataclass(frozen=True)
class HubDataset(Corpus):
    """A Hugging Face hub dataset, or a local copy; with ``held_out_documents`` N, the first N documents
    of its train split are the validation split."""

    repo: str
    config: str | None
    held_out_documents: int = 0
    streams_training: bool = False
    to_documents: Callable[[Iterable[str]], Iterator[str]] = functools.partial(filter, None)  # the non-empty texts

    def _source(self, split: str, path: str | None, path_field: str, streaming: bool):
        hub_split = "train" if self.held_out_documents else split
        return load_rows(self.repo, self.config, hub_split, path, path_field, streaming)

    def training_rows(self, path: str | None, path_field: str) -> datasets.IterableDataset:
        """The training rows as a fresh, resumable (``state_dict``) stream."""
        return self._source("train", path, path_field, streaming=True).skip(self.held_out_documents)

    def documents(self, split: str, path: str | None, path_field: str) -> Iterator[str]:
        if not self.held_out_documents:
            return self.to_documents(iter_text(self._source(split, path, path_field, streaming=False)))
        if split == "validation":
            rows = self._source(split, path, path_field, streaming=True).take(self.held_out_documents)
        else:
            rows = self.training_rows(path, path_field)
        return self.to_documents(iter_text(rows))

    def check_path(self, path: str | None, path_field: str) -> None:
        if path:  # a local copy: a folder with files, or files resolve_local_files finds (no stat: cheap)
            expanded = os.path.expanduser(path)
            if not os.path.isdir(expanded):
                resolve_local_files(path, path_field)
            elif not any(files for _, _, files in os.walk(expanded)):
                raise DataConfigError(f"{path_field}: {path!r} is an empty directory")

    def check_here(self, path: str | None, path_field: str) -> None:
        if path or not datasets.config.HF_HUB_OFFLINE:
            return
        cached = os.path.join(datasets.config.HF_DATASETS_CACHE, cache_folder_name(self.repo))  # no network
        if self.streams_training or not os.path.isdir(cached):
            name = f"{self.repo} ({self.config})" if self.config else self.repo
            raise DataConfigError(
                f"{path_field}: the Hugging Face hub is offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and "
                f"{name} is not in the datasets cache; set {path_field} to a local copy"
            )

    def identity(self, split: str, path: str | None, path_field: str) -> dict[str, Any]:
        source = source_files(path, path_field) if path else "hub"
        return {
            "repo": self.repo,
            "config": self.config,
            "split": split,
            "held_out_documents": self.held_out_documents,
            "source": source,
        }


CORPORA: dict[str, Corpus] = {
    "enwiki_sample": EmbeddedWikipedia(),
    "local": LocalFiles(),
    "wikitext-103": HubDataset("Salesforce/wikitext", "wikitext-103-raw-v1", to_documents=wikitext_articles),
    "fineweb-edu": HubDataset(
        "HuggingFaceFW/fineweb-edu",
        "sample-10BT",
        held_out_documents=FINEWEB_VALIDATION_DOCUMENTS,
        streams_training=True,
    ),
    # The default data of the authors' lm_dispersion/pretrain_toy_gpt2_change_ffn/pretrain_toy_gpt2.py.
    "fineweb-edu-1B": HubDataset(
        "codelion/fineweb-edu-1B",
        None,
        held_out_documents=FINEWEB_VALIDATION_DOCUMENTS,
        streams_training=True,
    ),
}


def corpus(name: str, field: str) -> Corpus:
    """The corpus ``<field>`` names."""
    if name not in CORPORA:
        raise DataConfigError(f"{field}: unknown dataset {name!r}; choose from {sorted(CORPORA)}")
    return CORPORA[name]


def check_dataset(name: str, path: str | None, field: str) -> None:
    """Pre-launch check of ``<field>`` and ``<field>_path`` that never contacts the hub."""
    corpus(name, field).check_path(path, f"{field}_path")


def check_readable_here(name: str, path: str | None, field: str) -> None:
    """That this machine can read ``<field>``'s corpus (a launch asks, a plan or a dry run for a cluster does not)."""
    corpus(name, field).check_here(path, f"{field}_path")


def iter_documents(name: str, split: str, path: str | None, field: str) -> Iterator[str]:
    """Documents of ``name``'s ``split``. ``field`` names the config key for errors."""
    return corpus(name, field).documents(split, path, f"{field}_path")


def documents_identity(name: str, split: str, path: str | None, field: str) -> dict[str, Any]:
    """The token-cache identity of a split."""
    identity = corpus(name, field).identity(split, path, f"{field}_path")
    return {"dataset": name, "split": split, "documents_version": DOCUMENTS_VERSION, **identity}
