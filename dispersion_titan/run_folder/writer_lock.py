"""One writer per run folder: a lock file created with O_EXCL, so it holds on NFS and Lustre.

The training job's rank 0 takes it before TorchTitan writes anything (checkpoints,
TensorBoard files, ``run.json``) and keeps it for the run's life; the launch-time check
looks first, so a second launch into a busy folder ends in one line with nothing written.
The file names its owner (host, PID, Slurm job id). A lock is stale when its owner is gone:
on this host, its PID no longer runs or is a zombie; on another host, the owner has not touched the file
(every training step does) for ``STALE_AFTER_S``. A Slurm requeue of the same job takes its
own lock over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..utils.errors import DispersionTitanError

LOCK_NAME = ".writer.lock"
STALE_AFTER_S = 900.0


class RunFolderBusy(DispersionTitanError):
    """Another live run writes into this run folder."""


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    job_id: str  # SLURM_JOB_ID, or "" outside Slurm
    since: float

    def describe(self) -> str:
        job = f", Slurm job {self.job_id}" if self.job_id else ""
        return f"PID {self.pid} on {self.host}{job}, since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(self.since))}"


def this_process() -> Owner:
    return Owner(socket.gethostname(), os.getpid(), os.environ.get("SLURM_JOB_ID", ""), time.time())


def _read(path: Path) -> Owner | None:
    """The owner a lock file names, or None when it is unreadable (still being written, or damaged)."""
    try:
        return Owner(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def pid_runs(pid: int) -> bool:
    """Whether ``pid`` is a live process of this host. A zombie (state ``Z``: exited, not yet
    reaped, as under a container's PID 1 that never reaps) is dead, though ``kill(pid, 0)``
    still finds it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: its state below
        pass
    if not os.path.exists("/proc/self/stat"):  # no /proc (macOS): kill's answer stands
        return True
    try:  # "PID (comm) STATE ...": comm may hold spaces and parentheses, the state follows the last ")"
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):  # exited meanwhile
        return False
    return state not in ("Z", "X")


def live_owner(folder: str | os.PathLike) -> Owner | None:
    """The live owner of ``folder``'s lock, or None when it is free, stale or ours to take over."""
    path = Path(folder) / LOCK_NAME
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None
    owner = _read(path)
    me = this_process()
    if owner is None:  # half-written by a launch racing ours: live unless old
        return Owner("unknown host", 0, "", time.time() - age) if age < STALE_AFTER_S else None
    if owner.job_id and owner.job_id == me.job_id:  # the same Slurm job, requeued
        return None
    if owner.host == me.host:
        return owner if pid_runs(owner.pid) and owner.pid != me.pid else None
    return owner if age < STALE_AFTER_S else None


def busy_error(folder: str | os.PathLike, owner: Owner) -> RunFolderBusy:
    return RunFolderBusy(f"{folder}: another run is writing here ({owner.describe()}); wait for it to end, "
                         "or give this run its own --job.dump_folder")  # fmt: skip


def refuse_if_busy(folder: str | os.PathLike) -> None:
    """The launch-time look: one line if a live run owns ``folder``; takes nothing."""
    owner = live_owner(folder)
    if owner is not None:
        raise busy_error(folder, owner)


class WriterLock:
    """The lock of one run folder, held by this process from ``acquire`` to ``release``."""

    def __init__(self, folder: str | os.PathLike) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.owner = this_process()
        self.held = False

    def acquire(self) -> None:
        """Create the lock file with O_EXCL; a stale lock is moved aside first. RunFolderBusy if live."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                owner = live_owner(self.folder)
                if owner is not None:
                    raise busy_error(self.folder, owner) from None
                # Stale: rename is atomic, so of two launches breaking it only one succeeds.
                try:
                    os.replace(self.path, self.path.with_name(f"{LOCK_NAME}.stale-{self.owner.pid}"))
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(self.owner), f)
            self.held = True
            return
        raise busy_error(self.folder, _read(self.path) or Owner("unknown host", 0, "", time.time()))

    def touch(self) -> None:
        """Say this owner is alive (for hosts that cannot see its PID)."""
        if self.held:
            os.utime(self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours (a requeued job may have taken it over)."""
        if self.held and _read(self.path) == self.owner:
            self.path.unlink(missing_ok=True)
        self.held = False
