"""Named document sources. Each yields plain-text documents for a split.

``enwiki_sample`` is the offline default: the 106 real Wikipedia articles that ship in
gensim's wheel, with markup stripped by gensim's own wikicorpus utilities. ``local``
reads the user's jsonl / parquet / txt files through Hugging Face ``datasets`` builders.
"""

from __future__ import annotations

import bz2
import functools
import glob
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.resources import files

SPLITS = ("train", "validation")
ENWIKI_VALIDATION_EVERY = 10  # every 10th article is held out: a deterministic ~10% slice
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}


class DataConfigError(ValueError):
    """Bad dataset name or path; the message names the field or file."""


def enwiki_sample_path() -> str:
    return str(
        files("gensim")
        / "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
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


def enwiki_sample(split: str, path: str | None = None) -> Iterator[str]:
    del path  # embedded: nothing to override
    for i, article in enumerate(_enwiki_articles()):
        held_out = i % ENWIKI_VALIDATION_EVERY == ENWIKI_VALIDATION_EVERY - 1
        if held_out == (split == "validation"):
            yield article


def resolve_local_files(spec: str, field: str) -> list[str]:
    """Expand a comma-separated list of paths and globs; every entry must match a file."""
    paths: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        matches = sorted(glob.glob(os.path.expanduser(entry), recursive=True))
        if not matches:
            raise DataConfigError(f"{field}: no file matches {entry!r}")
        for match in matches:
            if os.path.splitext(match)[1] not in _LOCAL_BUILDERS:
                raise DataConfigError(
                    f"{field}: {match!r} is not one of {sorted(_LOCAL_BUILDERS)}"
                )
            if os.path.getsize(match) == 0:
                raise DataConfigError(f"{field}: {match!r} is empty")
        paths.extend(matches)
    if not paths:
        raise DataConfigError(f"{field}: the 'local' dataset needs file paths or globs")
    return paths


def local_files(split: str, path: str | None, field: str = "training.dataset_path") -> Iterator[str]:
    """Documents from jsonl/parquet (``text`` column) or txt files (one document per file)."""
    del split  # the user points each split at its own files
    from datasets import load_dataset

    for file in resolve_local_files(path or "", field):
        builder = _LOCAL_BUILDERS[os.path.splitext(file)[1]]
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        rows = load_dataset(builder, data_files=[file], split="train", **kwargs)
        if "text" not in rows.column_names:
            raise DataConfigError(f"{field}: {file!r} has no 'text' field")
        for text in rows["text"]:
            if text:
                yield text


@dataclass(frozen=True)
class Corpus:
    documents: Callable[..., Iterator[str]]
    needs_path: bool = False


CORPORA: dict[str, Corpus] = {
    "enwiki_sample": Corpus(enwiki_sample),
    "local": Corpus(local_files, needs_path=True),
}


def iter_documents(name: str, split: str, path: str | None, field: str) -> Iterator[str]:
    """Documents of ``name``'s ``split``. ``field`` names the config key for errors."""
    if name not in CORPORA:
        raise DataConfigError(f"{field}: unknown dataset {name!r}; choose from {sorted(CORPORA)}")
    corpus = CORPORA[name]
    if corpus.needs_path and not path:
        raise DataConfigError(f"{field}_path: dataset {name!r} needs a path")
    if corpus.needs_path:
        return corpus.documents(split, path, field=f"{field}_path")
    return corpus.documents(split, path)
