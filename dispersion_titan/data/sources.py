"""Rows with a ``text`` column, loaded by Hugging Face ``datasets`` from the hub, a local copy (a
``save_to_disk`` folder, a ``datasets`` cache, a folder of data files) or the user's own files
(docs/data.md).
"""

from __future__ import annotations

import glob
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any, Union

import datasets
import pyarrow.compute

from ..utils.errors import DataConfigError

Rows = Union[datasets.Dataset, datasets.IterableDataset]

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_SAVED_DATASET_MARKERS = ("dataset_dict.json", "state.json")


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
            if os.path.isdir(match):
                raise DataConfigError(f"{field}: {match!r} is a directory; name files or a glob")
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
        kwargs = {"sample_by": "document"} if builder == "text" else {}
        group = list(group)
        rows = datasets.load_dataset(builder, data_files=group, split="train", streaming=streaming, **kwargs)
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
        _split_of(dict(builder.config.data_files or {}), split, path, field)
        if streaming:
            return builder.as_streaming_dataset(split=split)
        builder.download_and_prepare()
        return builder.as_dataset(split=split)
    return rows.to_iterable_dataset() if streaming else rows  # Arrow on disk, streamed in order


def load_rows(repo: str, config: str, split: str, path: str | None, field: str, streaming: bool) -> Rows:
    """``split`` of hub dataset ``repo``/``config``, or of the local copy at ``path`` (``field``)."""
    if path and os.path.isdir(os.path.expanduser(path)):
        path = os.path.expanduser(path)
        return _require_text(_from_directory(path, repo, config, split, field, streaming), path, field)
    if path:
        return load_files(resolve_local_files(path, field), field, streaming)
    try:
        rows = datasets.load_dataset(repo, config, split=split, streaming=streaming)
    except ConnectionError as e:
        raise DataConfigError(
            f"{field}: cannot reach the Hugging Face hub for {repo} ({config}): {str(e).splitlines()[0]}; "
            f"set {field} to a local copy (its jsonl, parquet or txt files: paths or globs)"
        ) from None
    return _require_text(rows, repo, field)


def iter_text(rows: Rows) -> Iterator[str]:
    """The ``text`` values of ``rows`` in order, read in batches (bounded memory)."""
    for batch in rows.iter(batch_size=1024):
        yield from batch["text"]


def file_texts(files: list[str], field: str) -> Iterator[str]:
    """The ``text`` of every row of ``files``, in order; a row without one is refused, not dropped."""
    rows = load_files(files, field, False)
    column = rows.data.column("text")
    if column.null_count:
        index = pyarrow.compute.index(pyarrow.compute.is_null(column), True).as_py()
        raise DataConfigError(f'{field}: {_row_without_text(files, index)}; give every row a "text" string')
    return iter_text(rows)


def _row_without_text(files: list[str], index: int) -> str:
    """Where the first row without a text is: its file and line for JSON Lines, else its number."""
    for path in files:
        if BUILDERS[os.path.splitext(path)[1]] != "json":
            continue
        with open(os.path.expanduser(path), encoding="utf-8", errors="replace") as f:
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
