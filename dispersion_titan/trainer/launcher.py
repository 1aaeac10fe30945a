"""torchrun's own launch (``torch.distributed.run.run``) as ``launch/train.sh`` runs it, ending not in
a traceback but: nothing when the ranks said why in one line (``SAID_BY_THE_RANKS``: their status);
one line naming a rank killed by SIGKILL, almost always the OOM killer (137), or by torchrun itself
when it did not stop after SIGTERM (1); else torchrun's failure summary (1).
"""

from __future__ import annotations

import glob
import logging
import os
import signal
import sys
import tempfile

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from ..utils.errors import (
    INTERRUPT_SIGNALS,
    PREEMPTED_EXIT_CODE,
    CheckpointSaveError,
    DispersionTitanError,
    NonFiniteLossError,
    interrupted_exit_code,
)

SAID_BY_THE_RANKS = {
    PREEMPTED_EXIT_CODE,
    CheckpointSaveError.status,
    NonFiniteLossError.status,
    DispersionTitanError.status,
    *(interrupted_exit_code(s) for s in INTERRUPT_SIGNALS),
}


# torchrun's warnings while it forwards a signal: the ranks' line says what happened.
FORWARDING_NOISE = ("death signal, shutting down workers", "closing signal")
# torchrun's warning as it SIGKILLs a rank (its PID the first argument) still running after its SIGTERM
UNSTOPPED = "Unable to shutdown process "
_unstopped: set[int] = set()


def _quiet_forwarding(record: logging.LogRecord) -> bool:
    """Drop the forwarding warnings, and torchrun's "failed (exitcode: N)" line when the ranks
    said why in one line of their own (N in ``SAID_BY_THE_RANKS``); note the ranks torchrun SIGKILLs."""
    if str(record.msg).startswith(UNSTOPPED):
        _unstopped.add(record.args[0])
    said = (
        isinstance(record.msg, str)
        and record.msg.startswith("failed (exitcode: ")
        and bool(record.args)
        and record.args[0] in SAID_BY_THE_RANKS
    )
    return not said and not any(text in record.getMessage() for text in FORWARDING_NOISE)


def oom_message(rank: int) -> str:
    return (
        f"dispersion_titan: error: rank {rank} was killed by SIGKILL — most likely out of memory (the kernel's "
        "OOM killer); lower training.local_batch_size (or training.max_local_batch_size), or use more "
        "processes; the last complete checkpoint stands: relaunch the same command to resume"
    )


def unstopped_message(rank: int, first: int, exitcode: int, said: str | None = None) -> str:
    """``said``: the line rank ``first`` said where the console did not show it."""
    why = f"; it said: {said.removeprefix('dispersion_titan: ')}" if said else "; LOG_RANK= shows every rank's output"
    return (
        f"dispersion_titan: error: rank {rank} did not stop within torchrun's shutdown timeout after SIGTERM and "
        f"was killed; torchrun stopped the job because rank {first} failed (exit status "
        f"{exitcode if exitcode >= 0 else 128 - exitcode}){why}; the last complete checkpoint stands: relaunch the "
        "same command to resume"
    )


def _said(log_dir: str, local_rank: int) -> str | None:
    """The last line a rank said (``dispersion_titan: …``) in torchrun's copy of its stderr (``--tee``), if any."""
    logs = glob.glob(os.path.join(log_dir, "*", "attempt_*", str(local_rank), "stderr.log"))
    try:
        with open(max(logs, key=os.path.getmtime), errors="replace") as f:  # the last attempt's
            said = [line.strip() for line in f if line.startswith("dispersion_titan: ")]
    except (ValueError, OSError):  # no log (no --tee), or unreadable
        return None
    return said[-1] if said else None


def ending(
    error: ChildFailedError, log_dir: str | None = None, shown: set[int] | None = None
) -> tuple[int, str | None]:
    """(exit status, the line to print or None) for a job whose ranks failed; the line of a rank that failed first
    is repeated from torchrun's ``log_dir`` where the console did not show it (``shown``: its local ranks)."""
    failures = sorted(error.failures.items(), key=lambda item: item[1].timestamp)

    def unseen(local_rank: int) -> str | None:
        hidden = log_dir and shown is not None and local_rank not in shown
        return _said(log_dir, local_rank) if hidden else None

    killed = [rank for rank, f in failures if f.exitcode == -signal.SIGKILL and f.pid not in _unstopped]
    if killed:
        return 128 + signal.SIGKILL, oom_message(killed[0])
    unstopped = [rank for rank, failure in failures if failure.pid in _unstopped]
    if unstopped:
        first, failure = next((rank, f) for rank, f in failures if f.pid not in _unstopped)
        return 1, unstopped_message(unstopped[0], first, failure.exitcode, unseen(failure.local_rank))
    said_why = [(rank, f) for rank, f in failures if f.exitcode in SAID_BY_THE_RANKS]
    # torchrun SIGTERMs the others once one fails: a rank that dies of it (not started yet, or in its interpreter's
    # shutdown, which puts the default handlers back) only echoes that failure
    if said_why and all(f.exitcode in SAID_BY_THE_RANKS or f.exitcode == -signal.SIGTERM for _, f in failures):
        rank, failure = said_why[0]  # the others were stopped by torchrun: "interrupted" is all they said
        said = unseen(failure.local_rank)
        if said and any(_said(log_dir, shown_rank) == said for shown_rank in shown or ()):
            said = None  # a rank the console shows said the same: one line is enough
        return failure.exitcode, f"[rank {rank}] {said}" if said else None
    return 1, error.format_msg()


def run(argv: list[str]) -> int:
    """torchrun on ``argv``; the exit status, the failure said in at most one line."""
    args = torchrun.parse_args(argv)
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="torchelastic_")  # torchrun's own default, known here
    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_quiet_forwarding)
    try:
        torchrun.run(args)
    except SignalException as e:
        return interrupted_exit_code(int(e.sigval))  # forwarded to the ranks, which saved and said so
    except ChildFailedError as e:
        shown = set(map(int, args.local_ranks_filter.split(","))) if args.local_ranks_filter else None
        status, line = ending(e, args.log_dir, shown)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return status
    return 0
