"""How every command writes its outputs: to a temporary name, renamed into place, so an interrupted
command leaves the previous file or the new one. Results live in one folder per model state
(``step-N``, ``rev-NAME``); its result file, written last, marks it done."""

from __future__ import annotations

import csv
import errno
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING, TypeVar

from ..utils.errors import OutputError, error_line
from ..utils.records import STAGING, atomic_write

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STEP_FOLDER = re.compile(r"^step-(\d+)$")
"""A checkpoint's folder (``checkpoint/step-N``) and its results' (``OUT/step-N``)."""
RESULT_FOLDER = re.compile(rf"{STEP_FOLDER.pattern}|^rev-.+$")
"""A result folder: a checkpoint's, or a Hugging Face revision's (``revision_folder``)."""
SUMMARY_FILE = "summary.csv"
Result = TypeVar("Result")
FORMAT = 1
"""The shape of every record this package writes; raised when one changes (``check_format``)."""
FORMAT_KEY = "format"


def revision_folder(revision: str | None) -> str:
    """A Hugging Face revision's result folder: ``rev-NAME``, ``/`` as ``--`` (``rev-default``: the default one)."""
    return f"rev-{(revision or 'default').replace('/', '--')}"


def write_json(path: str, data: dict, default: Callable[[object], object] | None = None) -> None:
    atomic_write(path, lambda f: json.dump(data, f, indent=1, default=default))


def check_format(record: object, path: str) -> dict:
    """``record`` (read from ``path``) if it is a dict of this ``FORMAT``; else one line saying what to do."""
    found = record.get(FORMAT_KEY) if isinstance(record, dict) else None
    if found != FORMAT:
        raise OutputError(
            f"{path}: format {'unnumbered' if found is None else found}, and this dispersion_titan reads format "
            f"{FORMAT} only; read it with the dispersion_titan that wrote it, or make it anew in a new folder"
        )
    return record


def to_make(folder: str) -> str | None:
    """The outermost folder that making ``folder`` would make (``folder`` or one above it; None: it is there)."""
    path = os.path.realpath(folder)  # a link to a folder not made yet: that folder
    return next((p for p in reversed([path, *map(str, Path(path).parents)]) if not os.path.isdir(p)), None)


def ensure_writable(folder: str, option: str) -> str | None:
    """Create ``folder`` and prove a file can be written there, or fail naming it; the outermost folder this made
    (``folder`` or one above it; None: it was there), for ``remove_empty`` should the call write nothing there."""
    path, made = os.path.realpath(folder), to_make(folder)
    try:
        os.makedirs(path, exist_ok=True)  # another command making it too: refused by its lock, not here
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise OutputError(f"{option}: {folder}: not writable ({e.strerror or e})") from None
    return made


def check_writable(folder: str, option: str) -> None:
    """Refuse ``folder`` at once if it could not be made or written there, without making it: ``ensure_writable``
    makes it only once there is something to write."""
    path = os.path.realpath(folder)
    there = next(p for p in [path, *map(str, Path(path).parents)] if os.path.exists(p))
    if not os.path.isdir(there) or not os.access(there, os.W_OK | os.X_OK):
        read_only = os.path.isdir(there) and os.statvfs(there).f_flag & os.ST_RDONLY  # a mount's: not permissions
        reason = os.strerror(errno.ENOTDIR if not os.path.isdir(there) else errno.EROFS if read_only else errno.EACCES)
        raise OutputError(f"{option}: {folder}: not writable ({reason})")


def remove_empty(folder: str) -> None:
    """``folder`` and the folders inside it, those that hold nothing: what a call made and wrote nothing in."""
    for path, _, _ in os.walk(folder, topdown=False):
        with suppress(OSError):
            os.rmdir(path)


def listed(names: list, shown: int = 6) -> str:
    """``a, b, c`` for one-line messages; past ``shown`` names, ``a, b, … and N more``."""
    head = ", ".join(map(str, names[:shown]))
    return head if len(names) <= shown else f"{head} and {len(names) - shown} more"


def still_to_do(
    out: str,
    sources: dict[str, str],
    existing: dict[str, Result],
    differs: Callable[[Result], str],
    stale: Callable[[str, Result], bool],
    done: str,
) -> list[str]:
    """A command resumed into ``--out``: the result folders of ``sources`` (folder -> what it measures)
    without a result in ``existing`` yet. Refused in one line: results of other settings (``differs``), or
    of a checkpoint saved over since (``stale``). ``done``: "analyzed", "evaluated"."""
    if other := [name for name, result in existing.items() if differs(result)]:
        raise OutputError(
            f"--out: {out}: {listed(other)} {'was' if len(other) == 1 else 'were'} {done} with other settings "
            f"({differs(existing[other[0]])}); use another --out, or --force to recompute"
        )
    for name, source in sources.items():
        if name in existing and stale(source, existing[name]):
            raise OutputError(
                f"--out: {out}: {name} was {done} from another checkpoint than {source} holds now (saved again "
                "or replaced since); --force recomputes it"
            )
    return [name for name in sources if name not in existing]


def report_failed(failed: list[str], total: int, nouns: str, done: str) -> int:
    """How many of ``total`` could not be ``done``, each named in one line on stderr (exit status 1)."""
    if failed:
        error_line(f"{len(failed)} of {total} {nouns} could not be {done}: {', '.join(failed)}")
    return len(failed)


REWRITTEN = "--out is as it was (its files are moved in together once all are written); run it again"
"""What a command whose results ``staged`` writes says when it is stopped or fails: ``analyze compare``, ``family``,
``evaluate table``."""


@contextmanager
def staged(out: str, files: tuple[str, ...]) -> Iterator[str]:
    """A folder for ``files``, one command's results of several runs rewritten whole at each call: written in the
    folder this yields, hidden inside ``out``, then moved in, and those of ``files`` this call did not write
    removed (a ``--paired`` table of the last call beside a new family): a failed write leaves the last whole."""
    with tempfile.TemporaryDirectory(prefix=STAGING, dir=out, ignore_cleanup_errors=True) as new:
        yield new
        for name in files:
            if os.path.exists(os.path.join(new, name)):
                os.replace(os.path.join(new, name), os.path.join(out, name))
            else:
                with suppress(FileNotFoundError):
                    os.unlink(os.path.join(out, name))


def read_json_object(path: str, fix: str = "restore it, or remove it and rerun") -> dict:
    """``path``'s JSON object; an ``OutputError`` naming it, why, and ``fix`` where it is unreadable or none."""
    try:
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as e:  # ValueError: JSON's, UTF-8's, or ours
        raise OutputError(f"{path}: unreadable ({e}); {fix}") from None
    return data


def read_result_folders(
    out: str, file: str, read: Callable[[dict, str], tuple[Result, object]], folders: re.Pattern = RESULT_FOLDER
) -> dict[str, Result]:
    """Every result in ``out``'s ``folders``, by folder name in name order: what ``read`` makes of each ``file``'s
    record (and its path) and the step it records. One copied into another step's folder by hand, read as that
    step's, is refused."""
    results = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if folders.match(name) and os.path.isfile(path := os.path.join(out, name, file)):
            results[name], recorded = read(read_json_object(path), path)
            if (step := STEP_FOLDER.match(name)) and int(step[1]) != recorded:
                raise OutputError(
                    f"{path}: holds the result of step {recorded}, not of step {int(step[1])}; move it back, or "
                    "remove it and rerun"
                )
    return results


def shown(value: object) -> object:
    """Floats as shown in CSVs and tables: 6 significant digits (JSON keeps them whole)."""
    return f"{value:.6g}" if isinstance(value, float) else value


def write_csv(path: str, rows: list[dict]) -> None:
    def write(f: IO) -> None:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows({key: shown(value) for key, value in row.items()} for row in rows)

    atomic_write(path, write)


def format_table(rows: list[dict]) -> str:
    """Aligned plain-text table; floats with 6 significant digits."""
    cells = [["-" if v is None else str(shown(v)) for v in row.values()] for row in rows]
    header = list(rows[0])
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def headless_pyplot() -> ModuleType:
    """matplotlib's pyplot on the Agg backend, so figures render on nodes without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig: Figure, path: str) -> None:
    """Write ``fig`` atomically, then close it (pyplot keeps every figure until closed)."""
    import matplotlib.pyplot as plt  # already loaded by whoever drew ``fig``

    try:
        atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120), binary=True)
    finally:
        plt.close(fig)
