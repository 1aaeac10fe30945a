"""Named document sources (``[training] dataset`` / ``[validation] dataset``, ``CORPORA``): rows with a
``text`` column, loaded by Hugging Face ``datasets`` from the hub, a local copy as ``<section>.dataset_path``
(a ``save_to_disk`` folder, a ``datasets`` cache, a folder of data files) or the user's own files.
docs/data.md describes each.
"""

from __future__ import annotations

import bz2
import functools
import glob
import itertools
import json
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any, Union

import datasets
import pyarrow.compute

from ..utils.errors import DataConfigError, cause, raise_no_room
from ..utils.hub import hub_offline
from ..utils.package_data import package_file

SPLITS = ("train", "validation")
ENWIKI_VALIDATION_EVERY = 10  # every 10th article is held out: a deterministic ~10% slice
FINEWEB_VALIDATION_DOCUMENTS = 10_000
# Part of every token-cache key: bump it when the text → documents rules change.
DOCUMENTS_VERSION = 1


Rows = Union[datasets.Dataset, datasets.IterableDataset]

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
TEXT_ENCODING = "utf-8-sig"
"""How datasets' text builder decodes .txt files: a BOM (a Windows editor's "UTF-8 with BOM") skipped, as datasets
skips it in jsonl and ``analyze --texts`` does (was: kept, U+FEFF at the start of the first document)."""
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")


def resolve_local_files(spec: str, field: str) -> list[str]:
    """Expand a comma-separated list of paths and globs; every entry must match a file. A path that is there is
    that file, though its name holds a glob's characters (``corpus[2024].txt``)."""
    paths: list[str] = []
    for entry in (e.strip() for e in spec.split(",")):
        if not entry:
            continue
        path = os.path.expanduser(entry)
        matches = [path] if os.path.lexists(path) else sorted(glob.glob(path, recursive=True))
        if not matches:
            raise DataConfigError(f"{field}: no file matches {entry!r}")
        for match in matches:
            if not os.path.exists(match):
                raise DataConfigError(f"{field}: {match!r} is a symbolic link to nothing ({os.readlink(match)!r})")
            if os.path.isdir(match):
                raise DataConfigError(f"{field}: {match!r} is a directory; name files or a glob")
            if not os.path.isfile(match):
                raise DataConfigError(f"{field}: {match!r} is no regular file (a pipe or a device); name files")
            if os.path.splitext(match)[1] not in BUILDERS:
                raise DataConfigError(f"{field}: {match!r} is not one of {sorted(BUILDERS)}")
            if os.path.getsize(match) == 0:
                raise DataConfigError(f"{field}: {match!r} is empty")
        paths.extend(matches)
    if not paths:
        raise DataConfigError(f"{field}: needs a path (file paths or globs)")
    return paths


def _require_text(rows: Rows, where: str, field: str) -> Rows:
    if rows.column_names is not None and "text" not in rows.column_names:
        raise DataConfigError(f"{field}: {where} has no 'text' column (columns: {rows.column_names})")
    return rows


def load_files(files: list[str], field: str, streaming: bool) -> Rows:
    """The rows of ``files`` in order: jsonl/parquet rows, or one row per txt file."""
    parts = []
    for builder, group in itertools.groupby(files, key=lambda f: BUILDERS[os.path.splitext(f)[1]]):
        kwargs = {"sample_by": "document", "encoding": TEXT_ENCODING} if builder == "text" else {}
        group = list(group)
        level = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its own line for a bad file: said below
        try:
            files = [glob.escape(f) for f in group]  # datasets reads each as a pattern: a name's [1] is literal
            rows = datasets.load_dataset(builder, data_files=files, split="train", streaming=streaming, **kwargs)
        except (datasets.exceptions.DatasetGenerationError, pyarrow.ArrowInvalid) as e:  # a malformed row or file
            raise_no_room(e, datasets.config.HF_DATASETS_CACHE)  # datasets' Arrow copy of them: exit 74, not the files
            why = str(e.__cause__ or e).splitlines()[0]  # the first line: pyarrow's reason (cause() takes the last)
            named = ", ".join(group)
            raise DataConfigError(f"{field}: {named}: not readable as {builder} ({why}); fix the file") from None
        finally:
            datasets.logging.set_verbosity(level)
        parts.append(_require_text(rows, repr(group[0]), field).select_columns(["text"]))
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def cache_folder_name(repo: str) -> str:
    """How ``datasets`` names a hub dataset's folder in its cache (``owner___name``)."""
    owner, name = repo.split("/")
    return f"{owner}___{datasets.naming.camelcase_to_snakecase(name)}"


def _split_of(splits: dict[str, Any], split: str, where: str, field: str) -> Any:
    if split not in splits:
        raise DataConfigError(f"{field}: {where} has no {split!r} split (it has {sorted(splits)})")
    return splits[split]


def _from_directory(path: str, repo: str, config: str, split: str, field: str, streaming: bool) -> Rows:
    if any(os.path.exists(os.path.join(path, m)) for m in _SAVED_DATASET_MARKERS):
        saved = datasets.load_from_disk(path)
        rows = _split_of(saved, split, path, field) if isinstance(saved, datasets.DatasetDict) else saved
    elif os.path.isdir(os.path.join(path, cache_folder_name(repo))):  # datasets' own builder: no network
        from datasets.packaged_modules.cache.cache import Cache

        try:
            builder = Cache(
                cache_dir=path,
                repo_id=repo,
                dataset_name=repo.split("/")[1],
                config_name=config,
                version="auto",
                hash="auto",
            )
        except ValueError as e:  # the cache holds other configs only
            raise DataConfigError(f"{field}: {path}: {str(e).splitlines()[0]}") from None
        _split_of(builder.info.splits or {}, split, path, field)
        rows = builder.as_dataset(split=split)
    else:  # a folder of data files
        builder = datasets.load_dataset_builder(path)
        if builder.name == "text":  # .txt files, decoded as load_files does
            builder = datasets.load_dataset_builder(path, encoding=TEXT_ENCODING)
        _split_of(dict(builder.config.data_files or {}), split, path, field)
        if streaming:
            return builder.as_streaming_dataset(split=split)
        try:
            builder.download_and_prepare()
        except datasets.exceptions.DatasetGenerationError as e:  # its Arrow copy out of room, a file unnamed
            raise_no_room(e, datasets.config.HF_DATASETS_CACHE)
            raise
        return builder.as_dataset(split=split)
    return rows.to_iterable_dataset() if streaming else rows  # Arrow on disk, streamed in order


def load_rows(repo: str, config: str, split: str, path: str | None, field: str, streaming: bool) -> Rows:
    """``split`` of hub dataset ``repo``/``config``, or of the local copy at ``path`` (``field``)."""
    if path and os.path.isdir(os.path.expanduser(path)):
        path = os.path.expanduser(path)
        return _require_text(_from_directory(path, repo, config, split, field, streaming), path, field)
    if path:
        return load_files(resolve_local_files(path, field), field, streaming)
    with hub_offline() as offline:  # an unreachable hub: the cache at once, not 25 s of retries and their log line
        try:
            rows = datasets.load_dataset(repo, config, split=split, streaming=streaming)
        except ConnectionError as e:
            raise DataConfigError(
                f"{field}: cannot reach the Hugging Face hub for {repo} ({config}): {offline or cause(e)}; "
                f"set {field} to a local copy (its jsonl, parquet or txt files: paths or globs)"
            ) from None
    return _require_text(rows, repo, field)


def has_text(text: str) -> bool:
    """Whether ``text`` is a document: empty or whitespace alone (a blank row, a .txt of blank lines) is none."""
    return bool(text) and not text.isspace()


def iter_text(rows: Rows) -> Iterator[str]:
    """The ``text`` values of ``rows`` in order, read in batches (bounded memory)."""
    for batch in rows.iter(batch_size=1024):
        yield from batch["text"]


def _row_without_text(files: list[str], index: int) -> str:
    """Where the first row without a text is: its file and line for JSON Lines, else its number."""
    for path in files:
        if BUILDERS[os.path.splitext(path)[1]] != "json":
            continue
        with open(os.path.expanduser(path), encoding="utf-8-sig", errors="replace") as f:
            for number, line in enumerate(f, 1):
                try:
                    row = json.loads(line) if line.strip() else {"text": ""}
                except ValueError:
                    continue
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    return f'{path}: line {number} has no "text"'
    return f'row {index + 1} of {", ".join(files)} has no "text"'


def file_identity(path: str) -> tuple[str, int, int]:
    """(absolute path, size, mtime): a file's part of a token-cache key."""
    stat = os.stat(path)
    return os.path.abspath(path), stat.st_size, stat.st_mtime_ns


def source_files(path: str, field: str) -> list[tuple[str, int, int]]:
    """``file_identity`` of every file a local copy consists of: its cache identity."""
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        found = [os.path.join(root, f) for root, _, names in os.walk(expanded) for f in names]
    else:
        found = resolve_local_files(path, field)
    return [file_identity(f) for f in sorted(found)]


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
        """Every row's ``text``, in order; a row without one is refused, not dropped."""
        del split
        files = resolve_local_files(path or "", path_field)
        rows = load_files(files, path_field, False)
        column = rows.data.column("text")
        strings = pyarrow.types.is_string(column.type) or pyarrow.types.is_large_string(column.type)
        if column.null_count or not strings:  # a null, or a number or an object somewhere
            index = pyarrow.compute.index(pyarrow.compute.is_null(column), True).as_py() if column.null_count else 0
            raise DataConfigError(f'{path_field}: {_row_without_text(files, index)}; give every row a "text" string')
        return filter(has_text, iter_text(rows))

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
    to_documents: Callable[[Iterable[str]], Iterator[str]] = functools.partial(filter, has_text)

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
        return {
            "repo": self.repo,
            "config": self.config,
            "split": split,
            "held_out_documents": self.held_out_documents,
            "source": source_files(path, path_field) if path else "hub",
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
    if name not in CORPORA:
        raise DataConfigError(f"{field}: unknown dataset {name!r}; choose from {sorted(CORPORA)}")
    return CORPORA[name]


def path_field(field: str) -> str:
    """The path option beside dataset ``field``: ``training.dataset_path``, or a command's ``--dataset-path``."""
    return "--dataset-path" if field == "--dataset" else f"{field}_path"


def check_dataset(name: str, path: str | None, field: str, path_from: str = "") -> None:
    """Pre-launch check of ``<field>`` and its path (``path_from``: the option that gave it, if not the
    field's own) that never contacts the hub."""
    corpus(name, field).check_path(path, path_from or path_field(field))


def check_readable_here(name: str, path: str | None, field: str, path_from: str = "") -> None:
    """That this machine can read ``<field>``'s corpus (a launch asks, a plan or a dry run for a cluster does not)."""
    corpus(name, field).check_here(path, path_from or path_field(field))


def iter_documents(name: str, split: str, path: str | None, field: str, path_from: str = "") -> Iterator[str]:
    """Documents of ``name``'s ``split``. ``field`` names the config key for errors."""
    return corpus(name, field).documents(split, path, path_from or path_field(field))


def documents_identity(name: str, split: str, path: str | None, field: str, path_from: str = "") -> dict[str, Any]:
    """The token-cache identity of a split."""
    identity = corpus(name, field).identity(split, path, path_from or path_field(field))
    return {"dataset": name, "split": split, "documents_version": DOCUMENTS_VERSION, **identity}
