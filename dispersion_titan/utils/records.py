"""Records on disk: each file written atomically, so a reader sees the old one or the whole new one;
nested records flattened to dotted keys, to compare them key by key (``differences``); their numbers read back."""

from __future__ import annotations

import errno
import math
import numbers
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from .errors import OutputError

HELD: dict[str, Any] = {}
"""The folders this process writes as their one writer (``owners.owned``), by real path and as given (a link's: the
link removed or replaced is found too), each with its writer lock (its lock file: ``.path``)."""


# The process's umask, read once at import (reading sets it): read at each write, another thread's file made
# meanwhile (a checkpoint's, a TensorBoard event file) got the mode set; 0o077 here makes one private at worst.
UMASK = os.umask(0o077)
os.umask(UMASK)


@contextmanager
def holding(lock: Any) -> Iterator[None]:
    """``lock``'s folder held by it in ``HELD``, and found again at each ``atomic_write`` below it by its lock file:
    removed meanwhile (``rm -rf``), or a file put in its place, an OSError naming that file, not made anew by the
    write without its record (was exit 0, and the next command refused it as no command's)."""
    paths = {os.path.realpath(lock.folder), os.path.abspath(lock.folder)}
    HELD.update(dict.fromkeys(paths, lock))
    try:
        yield
    finally:
        for path in paths:
            del HELD[path]


def atomic_write(
    path: str, write: Callable[[IO], None], binary: bool = False, durable: bool = False, exclusive: bool = False
) -> None:
    """Call ``write`` on a temporary file next to ``path``, then rename it to ``path``; ``durable``: on disk
    before the rename (a token store's files: a crash must not leave one empty); ``exclusive``: linked into
    place instead, FileExistsError if ``path`` exists (it is never replaced)."""
    if os.path.isdir(path):  # os.replace's IsADirectoryError was a traceback after the work was done
        raise OutputError(f"{path}: a folder where this command writes a file; move the folder away and rerun")
    folder = os.path.dirname(os.path.abspath(path))
    places = (Path(folder), Path(os.path.realpath(folder)))
    for held, lock in list(HELD.items()):  # one removed or a file now: an OSError naming its lock, not made anew below
        if any(place.is_relative_to(held) for place in places):
            os.stat(lock.path)
    try:
        os.makedirs(folder, exist_ok=True)
    except FileExistsError as e:  # a file where the folder should be: was a traceback
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), folder) from e
    with naming(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
                write(f)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~UMASK)  # what ``open`` would give a new file (``mkstemp`` makes it private)
            if exclusive:
                os.link(tmp, path)
                os.unlink(tmp)
            else:
                os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise


@contextmanager
def naming(path: str) -> Iterator[None]:
    """A failed write raised naming ``path``, the file the user knows: a full disk met as a buffer is flushed names
    no file, and ``mkstemp``'s (no inode left) ``atomic_write``'s hidden temporary file."""
    try:
        yield
    except OSError as e:
        if e.errno and (e.filename is None or atomic_target(str(e.filename)) == os.path.abspath(path)):
            raise OSError(e.errno, e.strerror, path) from e
        raise


def atomic_target(path: str) -> str | None:
    """The file ``atomic_write`` is writing through its temporary file ``path`` (or was, if killed), else None."""
    folder, name = os.path.split(path)
    match = re.fullmatch(r"\.(.+)\.\w+\.tmp", name)  # mkstemp's prefix and suffix there
    return os.path.join(folder, match[1]) if match else None


STAGING = ".staging."
"""The prefix of a hidden folder a command fills before moving its files into place (`evaluate table`, `convert`)."""


def remove_stale_writes(folder: str) -> None:
    """Remove what writes killed midway (``kill -9``, a lost node) left in ``folder``, not below: ``atomic_write``'s
    ``.NAME.*.tmp`` files and ``STAGING`` folders. Only for the folder's one writer: no live process owns them."""
    for path in Path(folder).glob(".*.tmp"):
        if path.is_file():
            path.unlink(missing_ok=True)
    for path in Path(folder).glob(f"{STAGING}*"):
        shutil.rmtree(path, ignore_errors=True)


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one, their keys dotted (``section.key``)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return flat


def differences(old: dict, new: dict) -> str:
    """``key old vs new`` for each key whose values differ, in ``new``'s order, for one-line refusals."""
    keys = [*new, *(key for key in old if key not in new)]
    return ", ".join(f"{key} {old.get(key)!r} vs {new.get(key)!r}" for key in keys if old.get(key) != new.get(key))


def finite_number(value: object, key: str) -> float:
    """``value`` read back from a record: a finite number (a hand edit's NaN, text or ``true`` would be averaged or
    plotted as one), else ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{key}: {value!r} is no finite number")
    return float(value)
