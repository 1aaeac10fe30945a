"""Every folder has one owner: a run, or the results of one command for one run, recorded in
``.owner.json``. A command writes only into an empty folder or one it owns; anything else is
refused in one line naming the owner, before anything is written (docs/reliability.md).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ..utils.errors import FILE_ADVICE, OutputError
from ..utils.records import HELD, atomic_write, holding, remove_stale_writes
from . import outputs
from .outputs import FORMAT, FORMAT_KEY, STEP_FOLDER, check_format, ensure_writable, listed, remove_empty, staged
from .writer_lock import LOCK_NAME, WriterLock, sole_writer, this_command

OWNER_FILE = ".owner.json"
RUN_RELATIVE = "run_relative"
"""The record's key for its run's folder relative to its own, so a run moved with its folders stays their owner."""
RUN_METADATA_FILE = "run.json"
RUN_ID = "run_id"
"""``run.json``'s key for the run's identity (kept by its relaunches, copies and moves), and the record's for its
run's: a run moved away from its results is still their owner."""
TB_KEY = "metrics.save_tb_folder"
RUN_PATH_KEYS = {
    "checkpoint.folder": ("checkpoint folder", "checkpoint", "checkpoints"),
    "metrics.save_tb_folder": ("TensorBoard folder", "tb", "TensorBoard files"),
    "comm.save_traces_folder": ("flight-recorder folder", "comm_traces", "flight-recorder traces"),
    "profiling.save_traces_folder": ("profiler folder", "profile_traces", "profiler traces"),
    "profiling.save_memory_snapshot_folder": ("memory-snapshot folder", "memory_snapshot", "memory snapshots"),
}
"""The folders TorchTitan writes, each resolved against ``job.dump_folder``: what each is, its default, what it
holds."""
CONTAINERS = ("paper", "quickstart", "sweep")
"""Kinds whose folders hold other owners' folders: the runs and analyses they make."""


@dataclass(frozen=True)
class FolderOwner:
    """Who a folder belongs to: ``kind`` and ``run`` (None for results of several runs)."""

    kind: str
    run: str | None = None

    def __post_init__(self) -> None:
        """A run folder as one path (symlinks resolved); a Hugging Face model id as it is."""
        if self.run is not None and os.path.isdir(self.run):
            object.__setattr__(self, "run", os.path.realpath(self.run))

    def describe(self) -> str:
        if self.kind == "run":
            return f"run {self.run}" if self.run else "a run (its checkpoints)"
        return f"the {self.kind} of {self.run}" if self.run else f"a {self.kind} folder"


def is_run(folder: str) -> bool:
    """Whether ``folder`` is a run's root: it holds a ``run.json``."""
    return os.path.isfile(os.path.join(folder, RUN_METADATA_FILE))


def read_owner(folder: str) -> FolderOwner | None:
    """The owner ``folder`` records (None: none); a folder holding a ``run.json`` is that run's root."""
    if is_run(folder):
        return FolderOwner("run", folder)
    try:
        record = owner_record(folder)
        if record is not None:  # its run at RUN_RELATIVE from it if a run is there, else as recorded
            if not isinstance(record["kind"], str) or not isinstance(record.get("run"), str | None):
                raise TypeError("kind or run no string")  # was read as 'holds the 3 of 5'
            relative = record.get(RUN_RELATIVE)
            run = relative and os.path.normpath(os.path.join(os.path.realpath(folder), relative))
            moved = run and is_run(run)
            return FolderOwner(record["kind"], run if moved else record.get("run"))
    except (FileNotFoundError, NotADirectoryError, PermissionError):  # none; or not a folder: its writer says so
        pass
    except OutputError:  # of another format
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:  # damaged, or edited by hand
        if isinstance(e, OSError) and e.errno in FILE_ADVICE and not isinstance(e, IsADirectoryError):
            raise  # too long a path, a failing disk: not the record's fault, file_failure's line says what to do
        why = f"no {e}" if isinstance(e, KeyError) else e
        raise OutputError(f"{os.path.join(folder, OWNER_FILE)}: unreadable ({why}); restore it, or remove it and rerun")
    return None


def results_folder(run: str, name: str, file: str, what: str, command: str) -> str:
    """``run`` when it holds results (``step-N/{file}``, ``rev-NAME/{file}``), else ``run/{name}`` when that
    does; else one line saying which ``command`` makes them, of the run a folder inside one (its checkpoints)
    belongs to."""
    if not os.path.isdir(run):
        if run.startswith("hf:"):  # utils.hub.PREFIX: a model given for its results (was `no such folder`)
            raise OutputError(
                f"{run}: a Hugging Face model, which holds no {what}; make them with python -m "
                f"dispersion_titan.{command} {shlex.quote(run)} --out DIR, then give DIR"
            )
        raise OutputError(f"{run}: {'not a folder' if os.path.exists(run) else 'no such folder'}")

    def holds(folder: str) -> bool:
        return any(glob.glob(os.path.join(folder, pattern, file)) for pattern in ("step-*", "rev-*"))

    for folder in (run, os.path.join(run, name)):
        if holds(folder):
            return folder
    dump = next((str(p) for p in Path(run).resolve().parents if is_run(str(p))), None)
    if dump is not None:
        found = os.path.join(dump, name)
        made = (
            f"its {what} are in {found}"
            if holds(found)
            else f"no {what} yet: python -m dispersion_titan.{command} {dump}"
        )
        raise OutputError(f"{run}: a folder inside run {dump} ({made}); give the run's folder")
    if os.path.isfile(os.path.join(run, "config.json")):  # a model's folder: its results are in an --out of its own
        raise OutputError(
            f"{run}: a Hugging Face model's folder, which holds no {what}; make them with python -m "
            f"dispersion_titan.{command} hf:{run} --out DIR, then give DIR"
        )
    if (owner := read_owner(run)) is not None and owner.kind != "run":  # a table, a comparison: was "run analyze T"
        home = (
            f"the run's folder {shlex.quote(owner.run)}"
            if owner.run and is_run(owner.run)
            else "the runs it was made from"
        )
        raise OutputError(f"{run}: {owner.describe()}, which holds no {what}; give {home}")
    raise OutputError(
        f"{run}: no {what} here or in {os.path.join(run, name)} (run python -m dispersion_titan.{command} {run} first)"
    )


def results_run(folder: str, recorded: str) -> str:
    """The run whose results ``folder`` holds: its recorded owner, where that run is now (moved, or copied with
    them), else ``recorded``, the run the results name."""
    owner = read_owner(folder)
    return owner.run if owner and owner.run else recorded


def relocated(path: str, recorded_run: str, run: str) -> str:
    """Where ``path``, recorded inside ``recorded_run``, is in ``run`` now: a moved or copied run's results record
    the paths it had; what lies inside the run is found relative to it."""
    return os.path.join(run, os.path.relpath(path, recorded_run))


def _run_json(root: str) -> dict:
    """``root``'s ``run.json`` as written; {} where it has none, or none readable (its readers say so)."""
    with suppress(OutputError):  # none, unreadable, or no JSON object
        return outputs.read_json_object(os.path.join(root, RUN_METADATA_FILE))
    return {}


def run_id(run: str | None) -> str | None:
    """The identity ``run``'s ``run.json`` records (None: no run there, or one from before run ids)."""
    return None if run is None else _run_json(run).get(RUN_ID)


def moved_away(folder: str, owner: FolderOwner) -> bool:
    """Whether ``owner``'s run is the one ``folder``'s record names, moved away from it (``mv RUN RUN2``): no run where
    the record says, and the recorded identity ``owner``'s."""
    record = owner_record(folder) or {}
    recorded, identity = record.get("run"), record.get(RUN_ID)
    gone = isinstance(recorded, str) and not is_run(recorded)
    return gone and identity is not None and identity == run_id(owner.run)


def owner_record(folder: str) -> dict | None:
    """``folder``'s ``.owner.json`` as written (None: it has none); raises what reading it raised."""
    path = os.path.join(folder, OWNER_FILE)
    try:
        return check_format(json.loads(Path(path).read_text()), path)
    except FileNotFoundError:
        return None


def run_paths(root: str) -> dict[str, str]:
    """The run's folders (``RUN_PATH_KEYS``): as its ``run.json`` records them, else the defaults."""
    metadata = _run_json(root)
    recorded, settings = (metadata.get(key) or {} for key in ("paths", "settings"))
    if not all(
        isinstance(d, dict) and all(isinstance(d.get(k) or "", str) for k in RUN_PATH_KEYS)
        for d in (recorded, settings)
    ):
        raise OutputError(  # was an AttributeError or TypeError traceback
            f"{os.path.join(root, RUN_METADATA_FILE)}: invalid (paths or settings: no object of path strings); "
            "restore it: it records the run's model and settings"
        )
    real = os.path.realpath(root)  # recorded paths are relative to it (``outside_folders``), as the OS joins them
    return {
        key: os.path.normpath(os.path.join(real, recorded.get(key) or settings.get(key) or default))
        for key, (_, default, _) in RUN_PATH_KEYS.items()
    }


def empty(folder: str, links: Collection[str] = ()) -> bool:
    """Whether ``folder`` holds nothing but lock files, its record, empty folders and ``links`` (paths)."""
    if not os.path.isdir(folder):
        return True
    return all(
        name.startswith((LOCK_NAME, OWNER_FILE, f".{OWNER_FILE}."))  # the record, whole or being written
        or os.path.join(folder, name) in links
        or (path := Path(folder, name)).is_dir()
        and not path.is_symlink()
        and not any(path.iterdir())
        for name in os.listdir(folder)
    )


def inside(path: str, folder: str) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


def _problem(
    folder: str, owner: FolderOwner, linked: bool = False, links: Collection[str] = ()
) -> tuple[str, FolderOwner | None] | None:
    """Why ``owner`` may not write into ``folder`` (a real path), and who holds it; None when it may. ``linked``:
    the run reaches it through a link in its own folder, so files no command recorded there are its own; ``links``:
    its own links in ``folder`` (``ln -s /scratch/ckpt RUN/checkpoint`` before the first launch), no files."""
    home = container = None
    for ancestor in map(str, Path(folder).parents):
        holder = read_owner(ancestor)
        if holder is None:
            continue
        if holder.kind in CONTAINERS:
            container = container or (ancestor, holder)
            continue
        if holder.kind != "run":
            return f"is inside {ancestor}, {holder.describe()}", holder
        if holder.run != ancestor:  # a run's folder outside its root: its checkpoints, its TensorBoard files
            return f"is inside {ancestor}, a folder of {holder.describe()}", holder
        for key, path in run_paths(ancestor).items():
            path = os.path.realpath(path)
            if Path(folder).is_relative_to(path):
                return f"is {'' if folder == path else 'inside '}{holder.describe()}'s {RUN_PATH_KEYS[key][0]}", holder
        first = os.path.relpath(folder, ancestor).split(os.sep)[0]
        if STEP_FOLDER.match(first):
            return f"would make {holder.describe()}'s root look like a checkpoint folder ({first})", holder
        if owner.kind == "run":
            return f"is inside {holder.describe()}", holder
        if owner.run != holder.run:
            return f"is inside {holder.describe()}, which holds only its own results", holder
        home = holder  # a run's own results, in its root
        break
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "is a file, not a folder", None
    holder = read_owner(folder)
    if holder is not None and home is not None and holder.kind != "run":
        holder = FolderOwner(holder.kind, home.run)
    if holder is None:
        if linked or empty(folder, links):
            return None
        if container is not None:  # its runs/, logs/: was "holds files no dispersion_titan command recorded"
            where, whose = container
            again = f" (give {where} to go on with it)" if whose.kind == owner.kind else ""
            return f"is the {os.path.relpath(folder, where)} folder of the {whose.kind} in {where}{again}", whose
        names = listed(sorted(os.listdir(folder)), 3)
        return f"holds files no dispersion_titan command recorded as its own ({names})", None
    if holder.kind == "run" and (owner.kind != "run" or holder.run != owner.run):
        if holder.run is None:
            return "holds checkpoints no run recorded as its own", holder
        return f"is {'the' if holder.run == folder else 'a'} folder of {holder.describe()}", holder
    other_run = None not in (holder.run, owner.run) and holder.run != owner.run and not moved_away(folder, owner)
    if holder.kind != owner.kind or other_run:
        return f"holds {holder.describe()}", holder
    return None


def refuse_histograms_unless_ours(folder: str, owner: FolderOwner) -> None:
    """``refuse_unless_ours`` for an analysis's ``--tb-dir``, which may sit inside its run's TensorBoard folder."""
    real = os.path.realpath(folder)
    if owner.run is not None and is_run(owner.run):
        tb = os.path.realpath(run_paths(owner.run)[TB_KEY])
        if real != tb and Path(real).is_relative_to(tb):
            holder = read_owner(real)
            if holder is None or holder.kind == owner.kind:
                return
            raise OutputError(f"--tb-dir: {folder} holds {holder.describe()}; use another --tb-dir")
    refuse_unless_ours(folder, owner, "--tb-dir", "use another --tb-dir")


def refuse_unless_ours(
    folder: str,
    owner: FolderOwner,
    option: str,
    way_out: str,
    fork_hint: bool = False,
    linked: bool = False,
    links: Collection[str] = (),
) -> None:
    """One line naming the owner if ``owner`` may not write into ``folder``; looks only. ``fork_hint``: where
    the folder is another run's, also name ``--job.fork_from`` that run; ``linked``, ``links``: as ``_problem``'s."""
    problem = _problem(os.path.realpath(folder), owner, linked, links)
    if problem is None:
        return
    text, holder = problem
    if fork_hint and holder is not None and holder.kind == "run" and holder.run and is_run(holder.run):
        way_out += f", or branch from that run on purpose with --job.fork_from {shlex.quote(holder.run)}[@STEP]"
    raise OutputError(f"{option}: {folder} {text}; {way_out}")


def record_owner(folder: str, owner: FolderOwner) -> bool:
    """``write_record``, refusing a run that lost the race to a new folder; whether it wrote it."""
    if write_record(folder, owner):
        return True
    problem = _problem(os.path.realpath(folder), owner)  # by the rules, not the record's text: a copy's results
    if problem is not None and problem[1] is not None and problem[1].run is not None:
        raise OutputError(f"{folder}: {problem[1].describe()} took this folder just now; use another one")
    return False


def write_record(folder: str, owner: FolderOwner, **extra: object) -> bool:
    """Write ``folder``'s record, with ``extra`` entries, unless it has one; whether it wrote it. Written
    whole, then linked into place: another rank checking the folder meanwhile never reads it half-written."""
    local = owner.run is not None and os.path.isdir(owner.run)
    relative = {RUN_RELATIVE: os.path.relpath(owner.run, os.path.realpath(folder))} if local else {}
    identity = run_id(owner.run) if local else None
    record = {
        FORMAT_KEY: FORMAT,
        "kind": owner.kind,
        "run": owner.run,
        **relative,
        **({RUN_ID: identity} if identity else {}),
        "command": this_command(),
        "since": time.time(),
    }
    try:
        atomic_write(os.path.join(folder, OWNER_FILE), lambda f: json.dump({**record, **extra}, f), exclusive=True)
    except FileExistsError:
        return False
    return True


@contextmanager
def owned(folder: str, owner: FolderOwner, option: str = "--out") -> Iterator[WriterLock]:
    """``folder`` held as its one writer (``sole_writer``) by ``owner``, refused if another owns it or it is
    not writable; made here, so that no folder exists before its claim. A call that wrote nothing there takes
    its new record back, and removes the folder if it made it: one that failed, or whose every model state was
    skipped (exit 1), leaves no empty folder."""
    if not folder:  # an unset shell variable: was a record left in the working directory, then a traceback
        raise OutputError(f"{option}: empty; name a folder")
    if held := HELD.get(os.path.realpath(folder)):  # held again within (``rewritten`` inside its command's own
        yield held  # hold, taken before its imports): yielded as it is, the outer hold releasing it
        return
    way_out = f"use another {option}"
    refuse_unless_ours(folder, owner, option, way_out)
    made, taken = None, False
    try:
        made = ensure_writable(folder, option)
        with sole_writer(folder, ("command", way_out)) as lock, holding(lock):
            refuse_unless_ours(folder, owner, option, way_out)
            recorded = record_owner(folder, owner)
            results = [e.path for e in os.scandir(folder) if e.is_dir() and outputs.RESULT_FOLDER.match(e.name)]
            for path in (folder, *results):
                remove_stale_writes(path)  # of this command killed midway, in its folder and result folders: held
            try:
                yield lock
            except BaseException:
                if recorded and empty(folder):  # empty step folders too: a failed write's
                    with suppress(OSError):  # the folder read-only or a file now: the error raised is the one to fix
                        _take_back(folder)
                raise
            if recorded and os.path.isdir(folder):  # else moved or removed meanwhile
                taken = all(name.startswith((LOCK_NAME, OWNER_FILE)) for name in os.listdir(folder))
                if taken:  # an empty logs/ stays: Slurm jobs submitted here write into it
                    _take_back(folder)
    except BaseException:
        if made:  # the lock released: anything written keeps it
            remove_empty(made)
        raise
    if made and taken:
        remove_empty(made)


def _take_back(folder: str) -> None:
    with suppress(FileNotFoundError):  # the folder was moved or removed meanwhile
        os.unlink(os.path.join(folder, OWNER_FILE))


COMPARISON, FAMILY, TABLE = FolderOwner("comparison"), FolderOwner("family"), FolderOwner("table")
"""The owners of results of several runs rewritten whole (``rewritten``): ``analyze compare``, ``family``,
``evaluate table``. Each command holds its ``--out`` (``owned``) from before its imports to its end, so that of
two started at once into one ``--out`` one writes and the other is refused (was: each held it only to write its
files, so both wrote, in turn, and the first one's "written:" was overwritten)."""


@contextmanager
def rewritten(out: str, owner: FolderOwner, files: tuple[str, ...]) -> Iterator[str]:
    with owned(out, owner), staged(out, files) as new:
        yield new


def refuse_other_owners(dump: str, folders: dict[str, str], forking: bool = False) -> None:
    """A launch's look: its ``job.dump_folder`` and ``folders`` (by config key) are new, empty or its own. Another
    run's dump or checkpoint folder is also answered with ``--job.fork_from``, unless the launch is a fork already
    (a fork writes its own folders, its TensorBoard files too)."""
    owner = FolderOwner("run", dump)
    refuse_lost_run_json(dump)
    way_out = "give this run its own --job.dump_folder"
    real = os.path.realpath(dump)  # its links to its own folders, by the real path _problem looks at
    links = [os.path.join(real, os.path.relpath(p, dump)) for p in folders.values() if os.path.islink(p)]
    refuse_unless_ours(dump, owner, "job.dump_folder", way_out, fork_hint=not forking, links=links)
    for key, path in folders.items():
        if not inside(path, dump):  # elsewhere, or reached through a link in the run (its checkpoints moved away)
            way_out = f"give this run a {key} of its own (inside its --job.dump_folder, or a new folder)"
            linked = Path(os.path.abspath(path)).is_relative_to(os.path.abspath(dump))
            fork_hint = not forking and key == "checkpoint.folder"
            refuse_unless_ours(path, owner, key, way_out, fork_hint=fork_hint, linked=linked)
            if linked:
                refuse_original_folder(dump, key, path)


def refuse_original_folder(dump: str, key: str, link: str) -> None:
    """A copy's folder reached through a link it copied (``cp -a RUN COPY``, RUN's checkpoints moved and linked
    back): the original run's folder too, which relaunching the copy would write into. The copy's record names the
    run it was copied from (a run moved is none any more where it names)."""
    original, real = None, os.path.realpath(link)
    with suppress(OSError, ValueError):  # none, or damaged: a run's root is its own by its run.json
        original = (owner_record(dump) or {}).get("run")
    if original in (None, os.path.realpath(dump)) or not is_run(original):
        return
    if os.path.realpath(run_paths(original)[key]) == real:
        what, _, holds = RUN_PATH_KEYS[key]
        raise OutputError(
            f"{key}: {link} links to {real}, the {what} of run {original}, which {dump} was copied from; copy the "
            f"{holds} in place of the link (rm {shlex.quote(link)}; cp -a {shlex.quote(real)} {shlex.quote(link)}), "
            f"or branch from that run on purpose with --job.fork_from {shlex.quote(original)}[@STEP] into a new "
            "--job.dump_folder"
        )


def refuse_lost_run_json(dump: str) -> None:
    """A copied or moved run's root whose ``run.json`` is gone: its record, copied with it, names the original
    run, and the real cause is the missing ``run.json`` (was: "is a folder of run ORIGINAL")."""
    holder = None if is_run(dump) else read_owner(dump)
    if holder is None or holder.kind != "run" or holder.run in (None, os.path.realpath(dump)):
        return  # a run in its place whose run.json is gone: check_resume says so, naming its checkpoints
    if (owner_record(dump) or {}).get(RUN_RELATIVE) != os.curdir:  # a folder inside the run, not its root
        return
    home = f"from there (cp {shlex.quote(os.path.join(holder.run, RUN_METADATA_FILE))} {shlex.quote(dump)}/)"
    raise OutputError(
        f"{os.path.join(dump, RUN_METADATA_FILE)}: missing, but {dump} is run {holder.run}'s folder, copied or moved "
        f"(its {OWNER_FILE} says so); restore its run.json {home if is_run(holder.run) else 'from the original'}, "
        "or train anew in a new --job.dump_folder"
    )


def outside_folders(dump: str, folders: dict[str, str]) -> dict[str, str]:
    """Those of ``folders`` outside ``dump``, relative to its real path: ``run.json``'s ``paths``."""
    real = os.path.realpath(dump)
    return {
        key: os.path.relpath(os.path.realpath(path), real) for key, path in folders.items() if not inside(path, dump)
    }


def record_run_folders(dump: str, folders: dict[str, str]) -> None:
    owner = FolderOwner("run", dump)
    for path in (dump, *(os.path.join(os.path.realpath(dump), p) for p in outside_folders(dump, folders).values())):
        record_owner(path, owner)
