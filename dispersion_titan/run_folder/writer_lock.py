"""One writer per folder: a lock file created with O_EXCL (it holds on NFS and Lustre), naming its
owner. Training holds it in its run folder, every other command in the folder it writes, before
reading what the folder holds. A lock whose owner is gone is stale (docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..utils.errors import DispersionTitanError
from ..utils.records import naming

LOCK_NAME = ".writer.lock"
STALE_AFTER_S = 900.0
HEARTBEAT_S = 60.0
TURN_WAIT_S = 60.0
"""How long a write into a folder several commands share waits for the one another is making."""
COMMAND_CHARS = 160


TRAINING = ("run", "give this run its own --job.dump_folder")
"""Who writes a run folder, and where a refused writer goes instead (for the message)."""
COMMAND = ("command", "use another --out")


class RunFolderBusy(DispersionTitanError):
    """Another live writer (a training run, a command) writes into this folder."""


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    job_id: str  # SLURM_JOB_ID, or "" outside Slurm
    since: float
    command: str  # the owner's command line, shortened
    folder: str = ""  # the real path of the folder it locks: a copy (cp -a) of it is not locked

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        command = f", {self.command}" if self.command else ""
        return (
            f"PID {self.pid} on {self.host}{job}{command}, "
            f"since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.since))}"
        )


def this_command() -> str:
    """This process's command as typed (``python -m MODULE ARGS``, ``dispersion-titan COMMAND ARGS``), less
    the interpreter's path and options, cut to ``COMMAND_CHARS``."""
    typed = sys.orig_argv[1:]
    start = next((i for i, arg in enumerate(typed) if arg in ("-m", "-c") or not arg.startswith("-")), len(typed))
    if typed[start : start + 1] == ["-m"]:
        words = ["python", *typed[start:]]
    elif typed[start : start + 1] == ["-c"]:  # its code says nothing in one line
        words = ["python", "-c", "...", *typed[start + 2 :]]
    else:  # a script: a console script (its folder dropped) or a file
        words = [os.path.basename(typed[start]), *typed[start + 1 :]] if start < len(typed) else ["python"]
    text = shlex.join(words)
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def this_process() -> Owner:
    return Owner(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID", ""), time.time(), this_command())


def _read(path: Path) -> Owner | None:
    """The owner a lock file names, or None when it is unreadable (still being written, or damaged)."""
    try:
        return Owner(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def pid_runs(pid: int) -> bool:
    """Whether ``pid`` is a live process of this host; a zombie (as under a container's PID 1 that
    never reaps) is dead, though ``kill(pid, 0)`` finds it."""
    import psutil

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process, where its state cannot be read
        return True


def busy_error(folder: str | os.PathLike, owner: Owner, writers: tuple[str, str]) -> RunFolderBusy:
    noun, way_out = writers
    return RunFolderBusy(
        f"{folder}: another {noun} is writing here ({owner.describe()}); wait for it to end, or {way_out}"
    )


def refuse_if_busy(folder: str | os.PathLike, writers: tuple[str, str] = TRAINING) -> None:
    """The look before the work: one line if a live writer owns ``folder``'s lock; takes nothing. A lock is
    free to take when stale, or ours (this process, or the same Slurm job requeued)."""
    path = Path(folder) / LOCK_NAME
    try:
        age = time.time() - path.stat().st_mtime
    except (FileNotFoundError, NotADirectoryError):  # no lock, or no such folder (yet)
        return
    owner, me = _read(path), this_process()
    if owner is None:  # half-written by a launch racing ours: live unless old
        owner = Owner("unknown host", 0, "", time.time() - age, "") if age < STALE_AFTER_S else None
    elif owner.job_id and owner.job_id == me.job_id:  # the same Slurm job, requeued
        owner = None
    elif owner.host == me.host:
        here = owner.folder in ("", os.path.realpath(folder))  # else the lock was copied with its folder
        owner = owner if here and pid_runs(owner.pid) and owner.pid != me.pid else None
    elif age >= STALE_AFTER_S:
        owner = None
    if owner is not None:
        raise busy_error(folder, owner, writers)


class WriterLock:
    """The lock of one folder, held by this process from ``acquire`` to ``release``."""

    def __init__(self, folder: str | os.PathLike, writers: tuple[str, str] = TRAINING) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.owner = replace(this_process(), folder=os.path.realpath(folder))
        self.held = False
        self.writers = writers

    def acquire(self) -> None:
        """Create the lock file with O_EXCL; a stale lock is moved aside first. RunFolderBusy if live."""
        os.makedirs(os.path.realpath(self.folder), exist_ok=True)  # a link to a folder not made yet: that folder
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                refuse_if_busy(self.folder, self.writers)
                # Stale: rename is atomic, so of two launches breaking it only one succeeds.
                with suppress(FileNotFoundError):
                    os.replace(self.path, self.path.with_name(f"{LOCK_NAME}.stale-{self.owner.pid}"))
                continue
            try:
                with naming(str(self.path)), os.fdopen(fd, "w") as f:
                    json.dump(asdict(self.owner), f)
            except BaseException:  # a full disk: an empty lock refused every rerun for STALE_AFTER_S as live
                self.path.unlink()
                raise
            self.held = True
            return
        raise busy_error(self.folder, _read(self.path) or Owner("unknown host", 0, "", time.time(), ""), self.writers)

    def touch(self) -> None:
        """Say this owner is alive (for hosts that cannot see its PID); an OSError naming the lock if it is gone."""
        if self.held:
            with naming(str(self.path)):  # os.utime's names no file
                os.utime(self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours (a requeued job may have taken it over)."""
        if self.held and _read(self.path) == self.owner:
            self.path.unlink(missing_ok=True)
        self.held = False


@contextmanager
def sole_writer(
    folder: str | os.PathLike, writers: tuple[str, str] = COMMAND, wait: float = 0.0
) -> Iterator[WriterLock]:
    """Hold the lock of a command's output folder, touched so that other hosts see a long command alive. ``wait``:
    seconds to wait while a live writer holds it (a folder several commands write into one write at a time, an
    analysis's ``--tb-dir``), then RunFolderBusy."""
    lock, deadline = WriterLock(folder, writers), time.monotonic() + wait
    while True:
        try:
            lock.acquire()
            break
        except RunFolderBusy:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    done = threading.Event()

    def beat() -> None:
        while not done.wait(HEARTBEAT_S):
            try:
                lock.touch()
            except OSError:  # the folder went away: the command's own writes will say so
                return

    def release() -> None:
        done.set()
        heart.join()
        lock.release()

    heart = threading.Thread(target=beat, name="writer-lock-heartbeat", daemon=True)
    heart.start()
    try:
        yield lock
    except BaseException:
        with suppress(OSError):  # the folder read-only, gone or a file now: the error raised first is the one to fix
            release()
        raise
    release()
