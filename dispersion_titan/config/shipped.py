"""The configs shipped as package data, and ``init``'s copy of them into a folder, as the repository
lays them out."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from ..utils.errors import ArgumentError
from ..utils.package_data import package_file
from ..utils.records import atomic_target, atomic_write

SHIPPED = {
    "train_configs": ("train_configs",),
    os.path.join("launch", "sweep_example.toml"): ("launch_scripts", "sweep_example.toml"),
}
"""Where each lands in the user's folder (the repository's path) -> its place in the package."""


def shipped_files() -> dict[str, str]:
    """Relative destination -> installed source, for every shipped config."""
    files = {}
    for dest, parts in SHIPPED.items():
        source = package_file("dispersion_titan", *parts)
        if os.path.isfile(source):
            files[dest] = source
            continue
        for path in Path(source).rglob("*.toml"):
            files[os.path.join(dest, path.relative_to(source))] = str(path)
    return dict(sorted(files.items()))


def write_shipped(out: str) -> tuple[list[str], list[str]]:
    """Copy every shipped config under ``out``, never over a file; (written, kept) relative paths."""
    files = shipped_files()
    if os.path.exists(out) and not os.path.isdir(out):
        raise ArgumentError(f"DIR: {out} is a file; name a new or empty folder")
    folders = {os.path.dirname(dest) for dest in files}
    entries = ((str(path.relative_to(out)), path.is_dir()) for path in sorted(Path(out).rglob("*")))
    unknown = (rel for rel, is_dir in entries if rel not in (folders if is_dir else files))
    other = next((rel for rel in unknown if atomic_target(rel) not in files), None)  # not of init's, nor of one
    # writing DIR now (its temporary files): each config is linked into place by one init, kept by the other
    if other:
        raise ArgumentError(
            f"DIR: {out} holds other files ({other}); init writes only into a new or empty folder, "
            "or one it wrote: name another DIR"
        )
    written, kept = [], []
    for dest, source in files.items():
        with open(source, "rb") as src:
            try:  # whole or not at all (a half config would be kept by a rerun), never over a file
                atomic_write(os.path.join(out, dest), functools.partial(shutil.copyfileobj, src), True, exclusive=True)
            except FileExistsError:
                kept.append(dest)
                continue
        written.append(dest)
    return written, kept
