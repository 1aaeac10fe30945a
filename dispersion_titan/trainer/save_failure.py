"""A failed checkpoint save said in one line: the cause, where, the space needed, the checkpoint that
stands. DCP wraps each rank's error, and a short write in ``torch.save`` says only ``unexpected
pos``, so without an OS error the free space and ``ulimit -f`` name the cause. The half-written
``step-N`` is moved aside at once; earlier checkpoints are never touched. Another write of the run
failing so (``write_failure``) is one line too."""

from __future__ import annotations

import errno
import os
import resource
import shutil

import torch

from ..run_folder.checkpoints import last_complete_step, quarantine_incomplete
from ..utils.errors import (
    FILE_ADVICE,
    WRITE_ADVICE,
    CheckpointSaveError,
    error_chain,
    failed_file,
    file_failure,
    no_room,
)

RELAUNCH = "relaunch the same command to resume"
ADVICE = {code: f"{advice} and {RELAUNCH}" for code, advice in WRITE_ADVICE.items()}
FIX = f"fix the cause and {RELAUNCH}"


def _mb(size: float) -> str:
    return f"{size / 1e6:.0f} MB" if size >= 1e7 else f"{size / 1e6:.1f} MB"


def _cause(error: BaseException, needed: int, largest_file: int, free: int) -> tuple[str, str]:
    """(what went wrong, what to do)."""
    os_error = next((e for e in error_chain(error) if isinstance(e, OSError) and e.errno), None)
    if os_error is not None:
        return os.strerror(os_error.errno).lower(), ADVICE.get(os_error.errno, FIX)
    if free < needed:
        return os.strerror(errno.ENOSPC).lower(), ADVICE[errno.ENOSPC]
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if limit != resource.RLIM_INFINITY and limit < largest_file:
        return f"file size limit exceeded (ulimit -f: {_mb(limit)})", ADVICE[errno.EFBIG]
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"write failed ({type(error).__name__}: {first[:120]})", FIX


def save_failure(folder: str, step: int, error: BaseException, model: torch.nn.Module) -> CheckpointSaveError:
    """The one-line error for a failed save of ``step`` into ``folder`` (rank 0 moves it aside first)."""
    if os.environ.get("RANK", "0") == "0":
        quarantine_incomplete(folder)
    last = last_complete_step(folder, before=step)
    if last is not None:
        step_dir = os.path.join(folder, f"step-{last}")
        sizes = [os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(step_dir) for name in names]
        needed, largest = sum(sizes), max(sizes)
        estimate = f"needs about {_mb(needed)}, the size of step-{last}"
    else:
        # the weights and AdamW's two moments (global sizes): a full checkpoint's bulk
        needed = largest = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
        estimate = f"needs about {_mb(needed)} for the weights and AdamW state"
    free = shutil.disk_usage(folder).free
    reason, advice = _cause(error, needed, largest, free)
    good = f"the last good checkpoint is step-{last}" if last is not None else "no earlier checkpoint was saved"
    return CheckpointSaveError(
        f"{reason} saving step-{step} to {os.path.join(folder, f'step-{step}')} "
        f"({estimate}; {_mb(free)} free); {good}; {advice}"
    )


def write_failure(error: BaseException, dump: str, checkpoints: str) -> CheckpointSaveError | None:
    """A full disk, a quota or the file size limit met outside a checkpoint save (TorchTitan's config dump,
    the logs, TensorBoard), or a file the environment took away or refuses (``file_failure``: a token store's
    shard removed), in one line naming the last good checkpoint, or None when ``error`` is no such failure (the
    commands' line would say ``train``'s ``nothing saved``)."""
    os_error = no_room(error) or file_failure(error)
    if os_error is None:
        return None
    last = last_complete_step(checkpoints) if os.path.isdir(checkpoints) else None
    good = f"the last good checkpoint is step-{last}" if last is not None else "no checkpoint was saved yet"
    if os_error.errno not in WRITE_ADVICE:
        return CheckpointSaveError(f"{failed_file(os_error)}; {good}; {FILE_ADVICE[os_error.errno]} and {RELAUNCH}")
    where = os_error.filename or f"the run's files in {dump}"
    there = os.path.abspath(os.fsdecode(os_error.filename or dump))  # the free space of where the write failed
    while not os.path.isdir(there):
        there = os.path.dirname(there)
    free = _mb(shutil.disk_usage(there).free)
    return CheckpointSaveError(
        f"{os.strerror(os_error.errno).lower()} writing {where} ({free} free); {good}; {ADVICE[os_error.errno]}"
    )
