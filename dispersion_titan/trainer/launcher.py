"""torchrun's own launch (``torch.distributed.run.run``) as ``launch/train.sh`` runs it, ending not in
a traceback but: nothing when the ranks said why in one line (``SAID_BY_THE_RANKS``: their status);
one line naming a rank killed by SIGKILL (137: out of memory where the kernel shows an OOM kill, else kill -9
or the OOM killer), or by torchrun itself when it did not stop after SIGTERM (1); else torchrun's failure summary
(1).
"""

from __future__ import annotations

import glob
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ..config.cli import load_toml, with_config_module
from ..run_folder.checkpoints import last_complete_step
from ..utils.errors import (
    INTERRUPT_SIGNALS,
    NOTHING_KEPT,
    PREEMPTED_EXIT_CODE,
    CheckpointSaveError,
    DispersionTitanError,
    NonFiniteLossError,
    interrupted_exit_code,
)

RESUMES = "the last complete checkpoint stands: relaunch the same command to resume"
"""What a killed job keeps where its config cannot be read again (``what_stands``)."""

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
    said why in one line of their own (N in ``SAID_BY_THE_RANKS``), or N is SIGTERM's: a rank torchrun stopped once
    another failed, its first failure where both are stamped in one second (then after the ranks' line: seen in a CI
    under load), or one stopped from outside, which ``ending`` says; note the ranks torchrun SIGKILLs."""
    if str(record.msg).startswith(UNSTOPPED):
        _unstopped.add(record.args[0])
    said = (
        isinstance(record.msg, str)
        and record.msg.startswith("failed (exitcode: ")
        and bool(record.args)
        and record.args[0] in {*SAID_BY_THE_RANKS, -signal.SIGTERM}
    )
    return not said and not any(text in record.getMessage() for text in FORWARDING_NOISE)


def what_stands(train_args: list[str] | None) -> str:
    """What a killed job leaves, from its ranks' own config (``train_args``, parsed as they parsed it): its last
    complete checkpoint, none yet, or none ever (checkpointing off); ``RESUMES`` without their arguments."""
    if train_args is None:
        return RESUMES
    from ..job_config import parse  # TorchTitan's import (3 s): at a killed job's end only, not every launch's start

    try:
        parse.setup_torchtitan()
        toml = load_toml(train_args)
        config = parse.parse_job_config(with_config_module(train_args, toml), toml)
    except Exception:  # noqa: BLE001 - a config the ranks took but this cannot read: say the usual
        return RESUMES
    if not config.checkpoint.enable:
        return f"{NOTHING_KEPT}: a relaunch starts over"
    step = last_complete_step(os.path.join(config.job.dump_folder, config.checkpoint.folder))
    if step is None:
        return "no checkpoint was complete yet: a relaunch starts over"
    return f"checkpoint step-{step} stands: relaunch the same command to resume from it"


def killed_message(rank: int, oom: bool, stands: str = RESUMES) -> str:
    """``oom``: the kernel shows an OOM kill (``oom_killed``); else a SIGKILL from anyone, the OOM killer among them;
    ``stands``: what the job leaves (``what_stands``)."""
    why = ": out of memory (the kernel's OOM killer); " if oom else " (kill -9, or the OOM killer); if out of memory, "
    return (
        f"dispersion_titan: error: rank {rank} was killed by SIGKILL{why}lower training.local_batch_size (or "
        f"training.max_local_batch_size), or use more processes; {stands}"
    )


def oom_kills() -> int | None:
    """The OOM kills in this process's memory cgroup so far (``oom_kill`` of cgroup v2's memory.events, or of v1's
    memory.oom_control); None where unreadable."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for _, controllers, path in (line.split(":", 2) for line in lines if line.count(":") >= 2):
        if controllers and "memory" not in controllers.split(","):
            continue
        file = f"memory{path}/memory.oom_control" if controllers else f"{path}/memory.events"  # v1, v2
        try:
            found = re.search(r"^oom_kill (\d+)$", Path(f"/sys/fs/cgroup/{file}").read_text(), re.MULTILINE)
        except OSError:
            continue
        if found:
            return int(found[1])
    return None


def oom_killed(pid: int, kills_before: int | None) -> bool:
    """Whether the kernel shows that the OOM killer killed ``pid``: its cgroup's count of OOM kills went up since
    ``kills_before`` (``oom_kills``), or its log (``dmesg``, where readable) names ``pid`` killed."""
    kills = oom_kills()
    if kills is not None and kills_before is not None and kills > kills_before:
        return True
    try:
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return re.search(rf"Killed process {pid}\b", log) is not None


def unstopped_message(rank: int, first: int, exitcode: int, said: str | None = None, stands: str = RESUMES) -> str:
    """``said``: the line rank ``first`` said where the console did not show it; ``stands``: ``what_stands``."""
    why = f"; it said: {said.removeprefix('dispersion_titan: ')}" if said else "; LOG_RANK= shows every rank's output"
    return (
        f"dispersion_titan: error: rank {rank} did not stop within torchrun's shutdown timeout after SIGTERM and "
        f"was killed; torchrun stopped the job because rank {first} failed (exit status "
        f"{exitcode if exitcode >= 0 else 128 - exitcode}){why}; {stands}"
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


def _gist(line: str | None) -> str | None:
    """A rank's line without its numbers: ranks meeting one full disk say it with the free space each measured."""
    return None if line is None else re.sub(r"\d+", "N", line)


def ending(
    error: ChildFailedError,
    log_dir: str | None = None,
    shown: set[int] | None = None,
    kills: int | None = None,
    train_args: list[str] | None = None,
) -> tuple[int, str | None]:
    """(exit status, the line to print or None) for a job whose ranks failed; the line of a rank that failed first
    is repeated from torchrun's ``log_dir`` where the console did not show it (``shown``: its local ranks); ``kills``:
    ``oom_kills`` at the launch; ``train_args``: the ranks' arguments, for what a killed job leaves."""
    failures = sorted(error.failures.items(), key=lambda item: item[1].timestamp)

    def unseen(local_rank: int) -> str | None:
        hidden = log_dir and shown is not None and local_rank not in shown
        return _said(log_dir, local_rank) if hidden else None

    killed = [(rank, f.pid) for rank, f in failures if f.exitcode == -signal.SIGKILL and f.pid not in _unstopped]
    if killed:
        stands = what_stands(train_args)
        return 128 + signal.SIGKILL, killed_message(killed[0][0], oom_killed(killed[0][1], kills), stands)
    if unstopped := [rank for rank, failure in failures if failure.pid in _unstopped]:
        first, failure = next((rank, f) for rank, f in failures if f.pid not in _unstopped)
        stands = what_stands(train_args)
        return 1, unstopped_message(unstopped[0], first, failure.exitcode, unseen(failure.local_rank), stands)
    said_why = [(rank, f) for rank, f in failures if f.exitcode in SAID_BY_THE_RANKS]
    # torchrun SIGTERMs the others once one fails: a rank that dies of it (not started yet, or in its interpreter's
    # shutdown, which puts the default handlers back) only echoes that failure, as one that exits 1 since, its peer
    # gone (``secondary_failure_status``: rank 0 alone failed, writing TensorBoard's events)
    since = said_why[0][1].timestamp if said_why else 0

    def echoes(f: ProcessFailure) -> bool:
        stopped = f.exitcode == -signal.SIGTERM or (f.exitcode == 1 and f.timestamp >= since)
        return f.exitcode in SAID_BY_THE_RANKS or stopped

    if said_why and all(echoes(f) for _, f in failures):
        rank, failure = said_why[0]  # the others were stopped by torchrun: "interrupted" is all they said
        said = unseen(failure.local_rank)
        if said and any(_gist(_said(log_dir, shown_rank)) == _gist(said) for shown_rank in shown or ()):
            said = None  # a rank the console shows said the same (but for the free space it measured): one line
        return failure.exitcode, f"[rank {rank}] {said}" if said else None
    return 1, error.format_msg()


def quiet_timer_self_join() -> None:
    """For the rest of this launcher's life (the timer may be collected as it exits), ``sys.unraisablehook`` gets all
    but torch's own noise: a rendezvous keep-alive timer (``_PeriodicTimer``) collected by a garbage collection its own
    thread ran calls its finalizer there, which sets the stop event, then joins its own thread: "cannot join current
    thread", a traceback after the run's last line (seen in a CI under load); the thread stops anyway, at the event."""
    hook = sys.unraisablehook

    def timer_joined_itself(unraisable: Any) -> None:
        frames = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback else []
        if not (isinstance(unraisable.exc_value, RuntimeError) and any(f.name == "_stop_thread" for f in frames)):
            hook(unraisable)

    sys.unraisablehook = timer_joined_itself


def run(argv: list[str]) -> int:
    """torchrun on ``argv``; the exit status, the failure said in at most one line."""
    quiet_timer_self_join()
    args = torchrun.parse_args(argv)
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="torchelastic_")  # torchrun's own default, known here
    for name in ("torch.distributed.elastic.agent.server.api", "torch.distributed.elastic.multiprocessing.api"):
        logging.getLogger(name).addFilter(_quiet_forwarding)
    kills = oom_kills()
    try:
        torchrun.run(args)
    except SignalException as e:
        return interrupted_exit_code(int(e.sigval))  # forwarded to the ranks, which saved and said so
    except ChildFailedError as e:
        shown = set(map(int, args.local_ranks_filter.split(","))) if args.local_ranks_filter else None
        status, line = ending(e, args.log_dir, shown, kills, args.training_script_args)
        if line is not None:
            print(line, file=sys.stderr, flush=True)
        return status
    return 0
