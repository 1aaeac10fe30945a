"""``python -m dispersion_titan.quickstart ARGS`` whose own job server is forked from this process (itself a job
forked from the session's job server, ``support.launch``: TorchTitan imported) where the quickstart starts it as a
fresh interpreter, which spends about 6 s of CPU importing it again: for tests of the pipeline, not of its server's
fresh start (test_quickstart.py's sweep starts it fresh). The server is the product's ``serve`` with the quickstart's
preload; forked at the start, while this process has one thread. Run as a script: ``python forked_quickstart.py
ARGS``."""

from __future__ import annotations

import json
import os
import sys
import traceback

from dispersion_titan.reproduce.quickstart import pipeline
from dispersion_titan.reproduce.quickstart.jobs import Commands, _run, serve


class _Server:
    """A server forked now, as ``Commands`` uses its ``subprocess.Popen``: ``stdin``, ``stdout``, ``poll``,
    ``wait``. It serves once its first line, the preload, comes; at end of input before it, it ends."""

    def __init__(self) -> None:
        requests, to_server = os.pipe()
        from_server, answers = os.pipe()
        self.pid, self.returncode = os.fork(), None
        if self.pid == 0:
            status = 1
            try:
                os.close(to_server)
                os.close(from_server)
                os.dup2(requests, 0)
                os.dup2(answers, 1)
                sys.stdin, sys.stdout = open(0), open(1, "w")
                if line := sys.stdin.readline():
                    serve(json.loads(line))
                status = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        os.close(requests)
        os.close(answers)
        self.stdin, self.stdout = open(to_server, "w"), open(from_server)

    def poll(self) -> int | None:
        if self.returncode is None and (done := os.waitpid(self.pid, os.WNOHANG))[0]:
            self.returncode = os.waitstatus_to_exitcode(done[1])
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


class _ForkedServerCommands(Commands):
    """The quickstart's ``Commands`` with the server forked at the start, ``forked``."""

    forked: _Server

    def start(self, request: dict) -> int:
        with self.lock:
            if self.server is None:
                self.server = self.forked
                self.server.stdin.write(json.dumps(self.preload) + "\n")
        return super().start(request)


if __name__ == "__main__":
    _ForkedServerCommands.forked = _Server()
    pipeline.Commands = _ForkedServerCommands
    _run("dispersion_titan.quickstart", sys.argv[1:])
