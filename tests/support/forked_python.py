"""A ``python`` for the shell scripts under test (bench/*.sh) whose every ``python SCRIPT``, ``-m MODULE``,
``-c CODE`` or ``-`` (the script on stdin) is forked from the session's job server (``support.launch``: TorchTitan
imported once), where a fresh interpreter spends about 6 s of CPU importing it again; any other call runs this
interpreter itself. A forked call runs in the script's environment and folder, imports its PYTHONPATH's
``sitecustomize`` as a fresh start does, and answers with its output and exit status once it ends: no streaming
and no signals, for scripts whose steps end by themselves. Run as a script: the client, or in a forked job, the
call."""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _answer(connection: socket.socket) -> None:
    """One client's call forked from the job server, its completed process sent back."""
    from support.launch import _forked  # here: the client, this file too, starts without site-packages (-S)

    with connection, connection.makefile("rw") as stream:
        call = json.loads(stream.readline())
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".py") as code:
                code.write(call["stdin"])
                code.flush()
                argv = [code.name if arg == "-" and i == 0 else arg for i, arg in enumerate(call["argv"])]
                done = _forked(__file__, ["--job", *argv], call["env"], timeout=900, cwd=Path(call["cwd"]))
            answer = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        except Exception:  # the job server's failure, or a job past its time: the call's, said
            answer = {"returncode": 1, "stdout": "", "stderr": traceback.format_exc()}
        stream.write(json.dumps(answer))


@contextmanager
def forking_python(folder: Path) -> Iterator[Path]:
    """An executable ``folder/python`` whose calls are forked from the job server while the block runs."""
    sock = Path(tempfile.mkdtemp(prefix="python-"), "sock")  # short: a socket's path has at most 107 bytes
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.listen()

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the block ended
                return
            threading.Thread(target=_answer, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{__file__}" "{sock}" "$@"\n')
    python.chmod(0o755)
    try:
        yield python
    finally:
        server.close()
        sock.unlink()
        sock.parent.rmdir()


def _job(argv: list[str]) -> None:
    """In the forked job: ``python ARGV`` (``-m MODULE ...`` or ``SCRIPT ...``), after its ``sitecustomize``."""
    from dispersion_titan.reproduce.quickstart.jobs import _run  # here: as above

    module = argv[0] == "-m"
    target, args = (argv[1], argv[2:]) if module else (argv[0], argv[1:])
    sys.argv = [target, *args]  # as sitecustomize sees it at a fresh start
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ModuleNotFoundError as missing:  # none, as mostly
        if missing.name != "sitecustomize":
            raise
    _run(target, args)


def _client(sock: str, argv: list[str]) -> None:
    """``python ARGV``: forked where ARGV names a script, a module, code or stdin, else this interpreter itself."""
    if not argv or not (argv[0] == "-" or not argv[0].startswith("-") or argv[0] in ("-m", "-c") and len(argv) > 1):
        os.execv(sys.executable, [sys.executable, *argv])
    stdin = sys.stdin.read() if argv[0] == "-" else argv[1] if argv[0] == "-c" else ""
    argv = ["-", *argv[2:]] if argv[0] == "-c" else argv
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(sock)
        with connection.makefile("rw") as stream:
            stream.write(json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "stdin": stdin}))
            stream.write("\n")
            stream.flush()
            done = json.loads(stream.read())
    sys.stdout.write(done["stdout"])
    sys.stderr.write(done["stderr"])
    sys.exit(done["returncode"])


if __name__ == "__main__":
    _job(sys.argv[2:]) if sys.argv[1] == "--job" else _client(sys.argv[1], sys.argv[2:])
