"""Every error a user can cause, and the one way it ends a command (``command``): one line naming the
field, flag or file, an exit status. No heavy imports: ``train`` uses it before TorchTitan.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Any, NoReturn, TypeVar

Main = TypeVar("Main", bound=Callable[..., Any])
WRITE_FAILED = 74  # EX_IOERR of sysexits.h
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL of sysexits.h: "temporary failure, try again"
INTERRUPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
WRITE_ADVICE = {
    errno.ENOSPC: "free space",
    errno.EDQUOT: "free space",
    errno.EFBIG: "raise the file size limit (ulimit -f)",
}
"""A write that failed for want of room, and what to do."""
FILE_ADVICE = {
    errno.ENOENT: "put back what was removed or moved (it, or a folder on its path)",
    errno.ENOTDIR: "move aside the file that stands where a folder on its path should be",
    errno.EISDIR: "move aside the folder that stands where the file should be",
    errno.EACCES: "fix its permissions, or its folder's",
    errno.EPERM: "fix its permissions, or its folder's",
    errno.EROFS: "remount its file system writable, or give a folder on another",
    errno.ENAMETOOLONG: "give a shorter path",
    errno.EIO: "check the disk or network file system it is on (dmesg)",
    errno.ESTALE: "check the disk or network file system it is on (dmesg)",
}
"""A file or folder the environment took away or refuses while a command runs, and what to do."""
NOTHING_KEPT = "checkpointing is off (checkpoint.enable = false), so nothing was saved"
"""What a run that stops early keeps without checkpoints: its relaunch starts over."""
NO_TEMP_DIR = "No usable temporary directory found"  # tempfile's error, e.g. torch's import on a full /tmp


class DispersionTitanError(ValueError):
    """Bad input or a failed run, reported in one line; ``status`` is the exit status."""

    status = 2


class ArgumentError(DispersionTitanError):
    """Bad command line or TOML file."""


class ConfigError(DispersionTitanError):
    """An invalid configuration value."""


class UnwritableFolderError(ConfigError):
    """A folder a launch writes that it cannot write; where its run is finished, the launch says that instead."""


class DataConfigError(DispersionTitanError):
    """Bad dataset name, path or contents."""


class CheckpointError(DispersionTitanError):
    """A missing, partial or corrupt checkpoint."""


class RenamedCheckpointError(CheckpointError):
    """A complete checkpoint whose ``step-N`` folder name is not the step it holds."""


class AnalysisError(DispersionTitanError):
    """Bad analysis options or inputs."""


class OutputError(DispersionTitanError):
    """An output folder a command cannot use: not writable, a result file unreadable, another owner's."""


class EvaluationError(DispersionTitanError):
    """Bad evaluation or table options or inputs."""


class ModelLoadError(DispersionTitanError):
    """A Hugging Face model that cannot be loaded: unknown id, missing files, unsupported architecture."""


class DeviceError(DispersionTitanError):
    """Allocated GPUs torch cannot use, or a ``--device`` or ``--dtype`` this machine lacks."""


class RunFinished(DispersionTitanError):
    """Not an error: the run already reached ``training.steps``; said in one line, exit 0."""

    status = 0


class NonFiniteLossError(DispersionTitanError):
    """The loss became NaN or infinite; training stopped before saving that step."""

    status = 3


class CheckpointSaveError(DispersionTitanError):
    """A checkpoint could not be written; earlier ones are intact."""

    status = WRITE_FAILED


def interrupted_exit_code(signum: int) -> int:
    return 128 + signum


def interrupt_signal(interrupt: BaseException) -> int:
    """The signal a ``KeyboardInterrupt`` stands for: its argument where a handler of ours raised it, else SIGINT."""
    return (interrupt.args or (signal.SIGINT,))[0]


def error_chain(error: BaseException, implicit: bool = True) -> Iterator[BaseException]:
    """``error``, its chained causes (``raise ... from``; ``implicit``: also the errors it was raised while
    handling), and the per-rank errors a DCP ``CheckpointException`` holds."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [c for c in (e.__cause__, e.__context__ if implicit else None) if c is not None]
        for failure in getattr(e, "failures", {}).values():  # CheckpointException: rank -> (error, traceback)
            todo += [f for f in (failure if isinstance(failure, tuple) else (failure,)) if isinstance(f, BaseException)]


def no_room(error: BaseException) -> OSError | None:
    """The full disk, quota or file size limit behind ``error`` (``error_chain``), if any."""
    return next((e for e in error_chain(error) if isinstance(e, OSError) and e.errno in WRITE_ADVICE), None)


def raise_no_room(error: BaseException, where: str) -> None:
    """The out-of-room ``OSError`` behind ``error``, if any, raised as a write of ``where`` where it names no
    file: the commands' line, exit 74 (datasets wraps its cache's in a ``DatasetGenerationError``, nameless)."""
    full = no_room(error)
    if full is not None:
        raise OSError(full.errno, full.strerror, full.filename or where) from error


def file_failure(error: BaseException) -> OSError | None:
    """The failure of a named file or folder behind ``error`` that the environment caused (``FILE_ADVICE``: gone,
    a file in a folder's place, not permitted, read-only, too long a path, the device's): ``error`` itself, what it
    was raised from, or a DCP rank's. Not one it was raised while handling, which a program may have caught and gone
    on from, nor one naming no file or of another errno: a bug's, shown with its traceback."""
    return next(
        (
            e
            for e in error_chain(error, implicit=False)
            if isinstance(e, OSError) and e.errno in FILE_ADVICE and isinstance(e.filename, (str, bytes, os.PathLike))
        ),
        None,
    )


def failed_file(error: OSError) -> str:
    """``file_failure``'s ``error`` said as its cause and file (and the second of a rename or link)."""
    second = f" -> {os.fsdecode(error.filename2)}" if error.filename2 is not None else ""
    return f"{os.strerror(error.errno).lower()}: {os.fsdecode(error.filename)}{second}"


def cause(error: BaseException, line: int = -1) -> str:
    """An exception's message's last line (where tracebacks put the cause; ``line`` 0: its first, where the hub and
    transformers put theirs), else its type's name."""
    text = str(error).strip()
    return text.splitlines()[line] if text else type(error).__name__


def docs_page(page: str, section: str = "") -> str:
    """A page of the project's docs as a message cites it: a wheel install has no ``docs/`` to point into."""
    return f"{page}{f' ({section!r})' if section else ''} in the dispersion_titan docs"


def error_line(message: str, prog: str = "dispersion_titan") -> None:
    """An error's line on stderr, on a line of its own and the last: open progress bars closed first (paper's,
    around the commands it runs, which it clears at its close)."""
    _close_progress_bars()
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)


def fail(message: str, status: int = 2, prog: str = "dispersion_titan") -> NoReturn:
    """One line on stderr (``error_line``) and a non-zero exit status (2: bad input, 3: training failed)."""
    error_line(message, prog)
    sys.exit(status)


def say(message: str, every_rank: bool = False) -> None:
    """A line from global rank 0 only (one line whatever ``LOG_RANK`` shows), unless ``every_rank``."""
    if every_rank or os.environ.get("RANK", "0") == "0":
        print(f"dispersion_titan: {message}", file=sys.stderr, flush=True)


REDELIVERY_S = 0.01


def command(interrupted: str, when: str = "") -> Callable[[Main], Main]:
    """The one error handling of a command's ``main``, never a traceback: a ``DispersionTitanError`` in
    one line with its status; a full disk (``no_room``) or a file the environment took away or refuses
    (``file_failure``) in one line with what to do and ``interrupted``, exit 74 (EX_IOERR: the same command goes on
    once it is fixed); Ctrl-C or SIGTERM in one line saying ``interrupted`` (``when``, what is kept, how to go on),
    from global rank 0 alone where ``when`` is given (``train``'s: torchrun stops every rank), else from any (a
    command a torchrun-launched script runs, RANK set)."""

    def wrap(main: Main) -> Main:
        def stopped(e: KeyboardInterrupt) -> NoReturn:
            _close_progress_bars()
            say(f"interrupted{f' {when}' if when else ''}; {interrupted}", every_rank=not when)
            sys.exit(interrupted_exit_code(interrupt_signal(e)))

        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> Any:
            hook = sys.unraisablehook
            sys.unraisablehook = functools.partial(_interrupt_again, hook)
            try:
                with interruptible():
                    return main(*args, **kwargs)
            except DispersionTitanError as e:
                fail(str(e).splitlines()[0] if str(e) else type(e).__name__, e.status)
            except KeyboardInterrupt as e:
                stopped(e)
            except Exception as e:
                if isinstance(e.__cause__, KeyboardInterrupt):  # Python 3.11 wraps one raised in a __set_name__
                    stopped(e.__cause__)
                if full := no_room(e):
                    where = f" writing {full.filename}" if full.filename else ""
                    advice = f"{WRITE_ADVICE[full.errno]}; {interrupted}"
                    fail(f"{os.strerror(full.errno).lower()}{where}; {advice}", WRITE_FAILED)
                if failed := file_failure(e):
                    fail(f"{failed_file(failed)}; {FILE_ADVICE[failed.errno]}; {interrupted}", WRITE_FAILED)
                raise
            finally:
                sys.unraisablehook = hook

        return run

    return wrap


def _close_progress_bars() -> None:
    """Close the open progress bars (tqdm's, if loaded) before a last line: an error or an interrupt left them open
    (lm-eval's, a local of a frame it unwound), so the line went onto the bar's line and the bar, closed when that
    frame was freed, followed it (over it, on a terminal). A bar cleared (paper's, ``leave=False``) ends its line
    with a bare carriage return: in a log, a new line ends it, else the line went onto the bar's."""
    bars = getattr(sys.modules.get("tqdm.std"), "tqdm", None)
    for bar in list(getattr(bars, "_instances", ())):
        bar.close()
        if bar.leave is False and not bar.fp.closed and not bar.fp.isatty():
            bar.fp.write("\n")


def _interrupted(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt(signum)


@contextmanager
def interruptible(handler: Callable[[int, Any], object] = _interrupted) -> Iterator[None]:
    """SIGTERM (``kill``, Slurm's ``scancel``) ends the block as Ctrl-C does, a ``KeyboardInterrupt`` naming the
    signal: it killed a command silently, exit 143. Both also where a background job (``cmd &``) inherited them
    ignored. ``handler`` in place of that: the caller's (submit's, holding them). The handlers before it come back
    after it (a command run by another, or in a test), unless the block set its own (train's, the trainer's
    SIG_IGN once its ranks stop on a non-finite loss): those stand."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread takes signals
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in INTERRUPT_SIGNALS}
    try:
        yield
    finally:
        for signum, before in previous.items():
            if signal.getsignal(signum) is handler:
                signal.signal(signum, signal.SIG_DFL if before is None else before)  # None: not set from Python


def _interrupt_again(hook: Callable[[Any], object], unraisable: Any) -> None:
    """A Ctrl-C or SIGTERM that landed in a finalizer, which cannot raise it: delivered again once it is done."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        threading.Timer(REDELIVERY_S, os.kill, (os.getpid(), interrupt_signal(unraisable.exc_value))).start()
    else:
        hook(unraisable)


CLOSED_PIPE_STATUS = 128 + signal.SIGPIPE  # a reader gone: as a shell reports a tool SIGPIPE killed


def run_command(main: Callable[[], object]) -> None:
    """A command's ``main`` as its entry point (the console script's: with its imports); a reader that went
    away (``... | head -3``) ends it quietly with ``CLOSED_PIPE_STATUS``, a Ctrl-C or SIGTERM during the imports
    in one line. Once ``main`` has ended, its outcome said and its exit status set, Ctrl-C is ignored: one that
    landed while the interpreter exits (atexit, thread joins, module teardown, where Python restores the default
    action) ended a finished command with a traceback, or killed it silently with status 130. SIGTERM has its
    action of before again (torchrun's, to a rank shutting down: the default, to end it)."""
    try:
        with starting():
            try:
                with interruptible():
                    main()
            finally:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _forget_handled_interrupts()
                sys.stdout.flush()
    except BrokenPipeError:
        if not any(map(_reader_gone, (sys.stdout, sys.stderr))):
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            os.dup2(devnull, stream.fileno())
        sys.exit(CLOSED_PIPE_STATUS)
    except FileNotFoundError as e:  # tempfile's, when no folder takes a file: torch's import on a full /tmp
        if not str(e.strerror).startswith(NO_TEMP_DIR):
            raise
        fail(f"{e.strerror}: full or not writable; free space, or set TMPDIR to a folder with room", WRITE_FAILED)


@contextmanager
def starting() -> Iterator[None]:
    """A Ctrl-C before the command's own handler (``command``) in one line, exit 130: the console script's command
    is imported under it (``run_command``); under ``python -m`` its module's imports come first, under
    ``interrupted_while_starting``."""
    try:
        yield
    except KeyboardInterrupt as e:
        _forget_handled_interrupts()
        print("dispersion_titan: interrupted while starting; nothing was done", file=sys.stderr, flush=True)
        sys.exit(interrupted_exit_code(interrupt_signal(e)))


def interrupted_while_starting(signum: int, frame: object) -> NoReturn:
    """SIGINT's handler from the package's import under ``python -m dispersion_titan.COMMAND`` (``__init__``) until
    its ``run_command``'s: ``starting``'s line once, further Ctrl-Cs ignored as it exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with starting():
        raise KeyboardInterrupt(signum)


def _forget_handled_interrupts() -> None:
    """CPython marks an interrupt that leaves code run from text (``exec(text)``: a dataclass or namedtuple made as
    a module loads) unhandled, whoever handles it later, and ``python -m`` then ends by SIGINT, after the command's
    line (status -2, not 130; ``evaluate table`` interrupted while it drew). Each such run clears the mark: an
    empty one, once every interrupt is handled here, forgets it."""
    exec("")


def _reader_gone(stream: IO) -> bool:
    """Whether ``stream`` is a pipe whose reading end is closed."""
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False
