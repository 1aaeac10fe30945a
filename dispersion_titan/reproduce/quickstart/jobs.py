"""The quickstart's jobs (and the tests'): commands forked from one server process that imported
torch, TorchTitan and dispersion_titan once, where a fresh interpreter spends about 5 s of CPU on
imports (the default quickstart: 3 min 42 s forked, 4 min 20 s fresh; measured 2026-11-28).
Linux only, as the quickstart (``os.sched_getaffinity``): elsewhere forking a process that has
imported torch is not safe. The tests extend the server with torchrun jobs (tests/support/jobs.py).

The server (``python -m dispersion_titan.reproduce.quickstart.jobs PRELOAD...``) imports each
PRELOAD (``module`` or ``module:function``, called once), then answers each JSON request line on
stdin with the forked job's pid, and writes the job's exit status to the request's ``status`` file.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable

from ...utils.errors import DispersionTitanError, interrupted_while_starting
from ...utils.records import atomic_write, naming


class Commands(contextlib.AbstractContextManager):
    """Runs commands with their output appended to a log file. ``env``: every command's environment
    on top of this process's."""

    server_args = ["-m", __name__]  # the server's command line after the interpreter, before the preloads

    def __init__(self, env: dict[str, str], preload: list[str]) -> None:
        self.env = env
        self.preload = preload
        self.server: subprocess.Popen | None = None
        self.status_dir = tempfile.mkdtemp(prefix="dispersion_titan-jobs-")
        self.lock = threading.Lock()
        self.count = 0

    def run(self, target: str, argv: list[str], log: str) -> int:
        """The exit status of ``target`` (a module, or a ``.py`` script) with ``argv``, its command
        line first in ``log`` (negative: killed by that signal)."""
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
        with naming(log), open(log, "a") as f:
            program = [target] if target.endswith(".py") else ["-m", target]
            f.write(f"$ {' '.join([sys.executable, *program, *argv])}\n")
        request = {"target": target, "argv": argv, "env": {**os.environ, **self.env}, "cwd": os.getcwd(), "log": log}
        self.start(request)
        while not os.path.exists(request["status"]):  # renamed into place once the output is flushed
            if self.server.poll() is not None:
                raise DispersionTitanError(f"the job server died before {log} ended; run the same command again")
            time.sleep(0.05)
        with open(request["status"]) as f:
            return int(f.read())

    def start(self, request: dict) -> int:
        """Fork ``request``'s job from the server (started if need be): its pid. ``request["status"]``
        is set to the file its exit status will be written to."""
        with self.lock:
            if self.server is None:
                self.server = subprocess.Popen(
                    [sys.executable, *self.server_args, *self.preload],
                    env={**os.environ, **self.env},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            self.count += 1
            request["status"] = os.path.join(self.status_dir, f"{self.count}.status")
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            return int(self.server.stdout.readline())

    def close(self) -> None:
        """Stop the server, which stops the commands still running (an interrupt), and remove the status files."""
        if self.server is not None:
            self.server.stdin.close()
            self.server.wait()
        shutil.rmtree(self.status_dir, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run(target: str, argv: list[str]) -> None:
    """``python -m MODULE ARGV`` or ``python SCRIPT ARGV``, in this process."""
    sys.argv = [target, *argv]
    sys.orig_argv = [sys.executable, target, *argv] if target.endswith(".py") else [sys.executable, "-m", *sys.argv]
    if target.endswith(".py"):
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
    else:
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def exit_status(request: dict) -> int:
    """Run the request in this (forked) process: its exit status as the interpreter's."""
    try:
        _run(request["target"], request["argv"])
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    return 0


def _job(request: dict, handlers: dict[int, object], run: Callable[[dict], int]) -> None:
    """The forked child: output to the request's log, in its environment and folder; its exit status,
    ``run``'s, is the job's."""
    status = 1
    try:
        for signum, handler in {**handlers, signal.SIGCHLD: signal.SIG_DFL}.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        out = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdin.close()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[1:1] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]  # as at a fresh start
        status = run(request)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def serve(preload: list[str], run: Callable[[dict], int] = exit_status) -> None:
    for entry in preload:
        module, _, function = entry.partition(":")
        imported = importlib.import_module(module)
        if function:
            getattr(imported, function)()
    # Preloaded modules are found in sys.modules when run as __main__, which a fresh
    # ``python -m`` never warns about.
    warnings.filterwarnings("ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning)
    status_files: dict[int, str] = {}

    def reap(signum: int, frame: object) -> None:
        """Each finished job's exit status (negative: killed by that signal), written whole."""
        while True:
            try:
                pid, wait_status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status = str(os.waitstatus_to_exitcode(wait_status))
            atomic_write(status_files.pop(pid), lambda f: f.write(status))

    signal.signal(signal.SIGCHLD, reap)
    # A Ctrl-C or a SIGTERM to the process group stops the jobs, never their server
    handlers = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    for line in sys.stdin:
        request = json.loads(line)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # reap no job before it is recorded
        pid = os.fork()
        if pid == 0:
            _job(request, handlers, run)
        status_files[pid] = request["status"]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        print(pid, flush=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # none reaped (its pid reused) while signalled
    for pid in status_files:  # the client closed before its jobs ended (interrupted, or killed)
        os.kill(pid, signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    while status_files:
        time.sleep(0.05)


if __name__ == "__main__":
    if signal.getsignal(signal.SIGINT) is interrupted_while_starting:  # the package's, for a command's imports
        signal.signal(signal.SIGINT, signal.default_int_handler)  # its jobs start as a fresh interpreter would
    serve(sys.argv[1:])
