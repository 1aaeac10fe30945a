"""Where results live and how they are written: every file goes to a temporary name in
the same folder and is renamed into place, so an interrupted analysis leaves either the
previous file or the new one, never half of one. A step's ``condensation.json`` is
written last and marks that step as done."""

from __future__ import annotations

import csv
import glob
import json
import os
import re
import tempfile
from collections.abc import Callable
from typing import IO

from . import AnalysisError
from .condensation_schema import Condensation
from .statistics import layer_fraction

RESULT_FILE = "condensation.json"
SUMMARY_FILE = "summary.csv"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_RESULT_DIR = re.compile(r"^(step-\d+|rev-.+)$")
SIGNIFICANT_DIGITS = 6


def _file_mode() -> int:
    """What ``open`` would give a new file (``mkstemp`` makes it private to the owner)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path: str, write: Callable[[IO], None], binary: bool = False) -> None:
    """Call ``write`` on a temporary file next to ``path``, then rename it to ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
            write(f)
        os.chmod(tmp, _file_mode())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: str, data: dict, default: Callable[[object], object] | None = None) -> None:
    """``default`` converts what ``json`` cannot (as in ``json.dump``)."""
    atomic_write(path, lambda f: json.dump(data, f, indent=1, default=default))


def write_result(path: str, result: Condensation) -> None:
    write_json(path, result.to_json())


def ensure_writable(folder: str, option: str) -> None:
    """Create ``folder`` and prove a file can be written there, or fail naming it."""
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise AnalysisError(f"{option}: {folder}: not writable ({e.strerror or e})") from None


def listed(names: list, shown: int = 6) -> str:
    """``a, b, c`` for one-line messages; past ``shown`` names, ``a, b, … and N more``."""
    head = ", ".join(map(str, names[:shown]))
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"


def result_path(out: str, folder: str, file: str = RESULT_FILE) -> str:
    """``folder``: ``step-N`` (a checkpoint of a run) or ``rev-NAME`` (a Hugging Face revision)."""
    return os.path.join(out, folder, file)


def find_results_folder(run: str, name: str, file: str = RESULT_FILE) -> str | None:
    """``run`` when it holds ``step-N/{file}`` results, else ``run/{name}`` when that does."""
    for folder in (run, os.path.join(run, name)):
        if glob.glob(os.path.join(folder, "step-*", file)):
            return folder
    return None


def read_step_files(out: str, file: str) -> dict[int, dict]:
    """Every step's JSON stored in ``out`` as ``step-N/{file}``, by step (results other than
    condensation analyses, e.g. evaluations)."""
    return {int(m.group(1)): data for name, data in _read_json_files(out, file).items()
            if (m := _STEP_DIR.match(name))}


def read_analyses(out: str) -> dict[str, Condensation]:
    """Every analysis stored in ``out``, by result folder name, in name order."""
    return {name: Condensation.from_json(data, result_path(out, name))
            for name, data in _read_json_files(out, RESULT_FILE).items() if _RESULT_DIR.match(name)}


def _read_json_files(out: str, file: str) -> dict[str, dict]:
    """``out/*/{file}`` parsed, by folder name, in name order."""
    results = {}
    if not os.path.isdir(out):
        return results
    for name in sorted(os.listdir(out)):
        path = result_path(out, name, file)
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise AnalysisError(f"{path}: unreadable ({e})") from None
            results[name] = data
    return results


def read_results(out: str) -> dict[int, Condensation]:
    """Every checkpoint's analysis stored in ``out``, by step."""
    steps = {int(m.group(1)): r for name, r in read_analyses(out).items() if (m := _STEP_DIR.match(name))}
    return dict(sorted(steps.items()))


def summary_rows(results: list[Condensation]) -> list[dict]:
    """One row per step (or revision) × layer."""
    rows = []
    for result in results:
        count = len(result.layers)
        for layer in result.layers:
            rows.append({
                "step": result.step,
                **({"revision": result.revision} if result.model else {}),
                "layer_index": layer.index,
                "layer": layer.name,
                "layer_fraction": layer_fraction(layer.index, count),
                "mean_cos": layer.mean_cos,
                "mean_cos_offdiag": layer.mean_cos_offdiag,
                "effective_rank": layer.effective_rank,
                "mev": layer.mev,
                "spearman": result.spearman,
                "kendall": result.kendall,
            })
    return rows


def shown(value: object) -> object:
    """Floats as shown in CSVs and tables: 6 significant digits (JSON keeps them whole)."""
    return f"{value:.{SIGNIFICANT_DIGITS}g}" if isinstance(value, float) else value


def write_csv(path: str, rows: list[dict]) -> None:
    def write(f: IO) -> None:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: shown(value) for key, value in row.items()} for row in rows)

    atomic_write(path, write)
