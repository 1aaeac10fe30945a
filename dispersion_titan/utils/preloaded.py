"""Commands (``python -m MODULE ARGS``) run as children of one server process that has
imported torch, TorchTitan and dispersion_titan once (multiprocessing's forkserver)
rather than each in a fresh interpreter: a fresh one spends about 5 s of CPU on imports,
a third of a short quickstart run. Linux only: elsewhere (macOS) forking a process that
has imported torch is not safe, so each command gets its own interpreter there."""

from __future__ import annotations

import importlib
import multiprocessing
import os
import subprocess
import sys


class Commands:
    """Runs commands with their output appended to a log file. ``env`` is every command's
    environment on top of this process's; ``preload``, the modules the server imports;
    ``fork=False``, a fresh interpreter per command instead."""

    def __init__(self, env: dict[str, str], preload: list[str], fork: bool = sys.platform == "linux") -> None:
        # Set here, before the server starts: it inherits them, and glibc's allocator and
        # OpenMP read theirs when a process starts or first loads torch.
        os.environ.update(env)
        self.server = multiprocessing.get_context("forkserver") if fork else None
        if self.server is not None:
            self.server.set_forkserver_preload(preload)

    def run(self, module: str, argv: list[str], log: str) -> int:
        """The exit status of ``python -m MODULE ARGV`` (negative: killed by that signal)."""
        os.makedirs(os.path.dirname(log), exist_ok=True)
        command = [sys.executable, "-m", module, *argv]
        with open(log, "a") as f:
            f.write(f"$ {' '.join(command)}\n")
            f.flush()
            if self.server is None:
                return subprocess.run(command, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        child = self.server.Process(target=_run_main, args=(module, argv, log), name=f"{module} {log}")
        child.start()
        child.join()
        return child.exitcode


def _run_main(module: str, argv: list[str], log: str) -> None:
    """In the forked child: ``MODULE.main()`` with ``argv``, stdout and stderr to ``log``;
    its ``sys.exit`` status becomes the child's exit code."""
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [module, *argv]
    importlib.import_module(module).main()
