"""The offline tasks' ``custom_dataset``: their data files beside this file, found from
any working directory (lm-eval 0.4.13 hands ``dataset_kwargs: data_files`` to
``datasets.load_dataset`` unchanged, which would resolve them against the current one)."""

from __future__ import annotations

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def jsonl(data_files: dict[str, str], **_metadata) -> datasets.DatasetDict:
    """``data_files`` (split: file name in this folder) as a DatasetDict; lm-eval also
    passes the task's ``metadata`` (its version), which the data do not depend on."""
    return datasets.load_dataset("json", data_files={split: str(HERE / name) for split, name in data_files.items()})
